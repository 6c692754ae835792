"""Connect error documents as the real service writes them: a code, a message and an
``aiserver.v1.ErrorDetails`` in ``details[]`` (the value the client reads, plus its debug JSON).
"""

from __future__ import annotations

import base64
from typing import Any

from workbench.schema import pb
from workbench.transport.unary import connect_error

ERROR_NUMBERS = {"ERROR_NOT_LOGGED_IN": 2, "ERROR_BAD_MODEL_NAME": 5, "ERROR_OPENAI": 13,
                 "ERROR_OUTDATED_CLIENT": 30, "ERROR_UNAUTHORIZED": 38, "ERROR_RATE_LIMITED_CHANGEABLE": 51}


def error_detail(error: str, title: str = "", detail: str = "", is_retryable: bool = False,
                 is_expected: bool = True) -> dict[str, Any]:
    """A Connect ``details[]`` entry carrying a real aiserver.v1.ErrorDetails (value + debug)."""
    num = ERROR_NUMBERS.get(error)
    if num is None:
        raise ValueError(f"unknown ErrorDetails error {error!r} (known: {', '.join(ERROR_NUMBERS)})")
    msg = pb.ErrorDetails(error=num, is_expected=is_expected,
                          details=pb.CustomErrorDetails(title=title, detail=detail, is_retryable=is_retryable))
    value = base64.b64encode(msg.SerializeToString()).decode().rstrip("=")
    return {"type": "aiserver.v1.ErrorDetails", "value": value,
            "debug": {"error": error, "details": {"title": title, "detail": detail, "isRetryable": is_retryable},
                      "isExpected": is_expected}}


def error_doc(code: str, message: str, error: str | None = None, title: str = "", detail: str = "",
              is_retryable: bool = False, is_expected: bool = True) -> dict[str, Any]:
    details = [error_detail(error, title, detail, is_retryable, is_expected)] if error else None
    return connect_error(code, message, details)

