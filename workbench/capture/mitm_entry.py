"""``mitmdump -s`` entry inside the package (what ``workbench capture`` loads)."""

from workbench.capture.addon import CursorCapture

addons = [CursorCapture()]
