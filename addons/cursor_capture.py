"""Record Cursor agent traffic with mitmproxy: ``mitmdump -s addons/cursor_capture.py``.

A thin entry over ``workbench.capture.addon``; options are documented there and in docs/capture.md
(``--set cursor_db=captures/workbench.duckdb``, ``cursor_redact=content``, ...).
"""

import sys
from pathlib import Path

try:
    from workbench.capture.addon import CursorCapture
except ImportError:  # a mitmdump outside the workbench venv, run from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from workbench.capture.addon import CursorCapture

addons = [CursorCapture()]
