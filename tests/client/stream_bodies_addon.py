"""A minimal mitmproxy addon for tests: stream every request and response body through unchanged
(plain mitmdump buffers them, which deadlocks a bidi ``Run``). Nothing else: the END_STREAM
handling is mitmproxy's own, which is what the test behind it exercises."""

from __future__ import annotations

from typing import Any


def requestheaders(flow: Any) -> None:
    flow.request.stream = True


def responseheaders(flow: Any) -> None:
    flow.response.stream = True
