"""Database work off the UI thread: thread workers that post their results as messages.

``Loader.load(fn, then, group=…)`` runs ``fn`` in a thread worker; the result comes back as a
``Loaded`` message handled on the UI thread (``then(result)``), a failure as ``LoadFailed``,
which bubbles to the app: the one place that reports errors (notification + log).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from textual.dom import DOMNode
from textual.message import Message
from textual.worker import get_current_worker

T = TypeVar("T")


class Loaded(Message, bubble=False):
    def __init__(self, then: Callable[[Any], None], result: Any) -> None:
        super().__init__()
        self.then = then
        self.result = result


class LoadFailed(Message):
    """Bubbles up to the app, which notifies the user and logs the traceback."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__()
        self.what = what
        self.error = error


class Loader(DOMNode):
    """Mixin for widgets and screens that read the database."""

    def load(self, fn: Callable[[], T], then: Callable[[T], None], *, group: str, what: str = "",
             exclusive: bool = True) -> None:
        def job() -> None:
            try:
                result = fn()
            except Exception as exc:  # reported on the UI thread, never raised in the worker
                self.post_message(LoadFailed(what or group, exc))
                return
            if not get_current_worker().is_cancelled:
                self.post_message(Loaded(then, result))

        self.run_worker(job, name=what or group, group=group, exclusive=exclusive, thread=True,
                        exit_on_error=False)

    def on_loaded(self, message: Loaded) -> None:
        message.stop()
        message.then(message.result)
