"""Live capture: a mitmproxy addon that streams agent flows and records them (see docs/capture.md).

``addon`` needs mitmproxy; ``writer``, ``spool`` and ``match`` do not.
"""
