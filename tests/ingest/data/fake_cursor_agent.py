#!/usr/bin/env python3
"""A stand-in for ``cursor-agent -p --output-format stream-json`` (test data, not a mock of ours).

Replays a stream-json NDJSON transcript on stdout line by line with short pauses, writes a line
on stderr like the real CLI's warnings, and exits with a chosen code. Environment:

- ``FAKE_AGENT_SCRIPT``: transcript to replay (default: ``stream-json.ndjson`` next to this file)
- ``FAKE_AGENT_GATE`` + ``FAKE_AGENT_GATE_AFTER``: after that many lines, wait until the gate
  file exists (so a test can look at the database while the CLI is still running)
- ``FAKE_AGENT_TAIL``: extra bytes written last, without a newline
- ``FAKE_AGENT_EXIT``: exit code (default 0)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if "--output-format" not in argv or "stream-json" not in argv:
        sys.stderr.write("fake-agent: only --output-format stream-json is supported\n")
        return 64
    script = Path(os.environ.get("FAKE_AGENT_SCRIPT") or Path(__file__).with_name("stream-json.ndjson"))
    gate = os.environ.get("FAKE_AGENT_GATE")
    gate_after = int(os.environ.get("FAKE_AGENT_GATE_AFTER") or 0)
    out = sys.stdout.buffer
    sys.stderr.write("fake-agent: using cached server config (agentn.global.api5.cursor.sh)\n")
    sys.stderr.flush()
    for n, line in enumerate(script.read_bytes().splitlines(keepends=True), 1):
        out.write(line)
        out.flush()
        time.sleep(0.005)  # the real CLI emits events as the model streams
        if gate and n == gate_after:
            deadline = time.monotonic() + 120
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
    tail = os.environ.get("FAKE_AGENT_TAIL")
    if tail:
        out.write(tail.encode())
        out.flush()
    return int(os.environ.get("FAKE_AGENT_EXIT") or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
