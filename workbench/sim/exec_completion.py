"""When does an exec count as answered? The simulated backend's ``stream_close`` policy.

Clients disagree on how an exec ends, and so has the service over time (docs/sim.md "Exec
completion", docs/protocol.md §5):

``required``  results, then ``exec_client_control_message.stream_close{id}``. Results alone leave the
              run heartbeating until the close comes: the stall of the December 2025 investigation.
``accepted``  (default) the result completes a non-streaming exec; a streamed shell completes on its
              ``exit`` event. A later ``stream_close`` — and the final ``shell_result`` a 2026 client
              sends after a shell stream — are welcome, neither needed nor faults.
``ignored``   the result completes; ``stream_close`` plays no part: it is never needed and a
              ``stream_close`` alone does not complete an exec.

Under every policy ``throw{id}`` completes an exec (with an error), and answers for an exec the
server aborted are dropped without complaint.

A policy is chosen per exec: the step's ``stream_close`` (tool and request_context steps), else the
scenario's (one value, or per exec type), else the server's (``--stream-close``, per exec type with
``--exec-stream-close KIND=POLICY``; ``--strict-stream-close`` = required).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.protocol.matching import client_message_correlation

REQUIRED = "required"
ACCEPTED = "accepted"
IGNORED = "ignored"
POLICIES = (REQUIRED, ACCEPTED, IGNORED)
DEFAULT_POLICY = ACCEPTED
EXEC_TYPES = ("shell", "shell_stream", "read", "write", "ls", "grep", "delete", "mcp", "request_context")
# ShellStream events after which no more output comes (the client may still send a final
# shell_result and the stream_close).
_FINAL_EVENTS = frozenset({"exit", "rejected", "permission_denied", "backgrounded"})


@dataclass(slots=True)
class ExecRecord:
    """One exec the server sent, as the client answered it (part of the run record)."""

    id: int
    exec_id: str
    kind: str
    results: int = 0
    closed: bool = False
    thrown: str | None = None
    aborted: bool = False
    policy: str = DEFAULT_POLICY
    # The run went on without waiting for this exec (a request_context the server does not block on):
    # its answers are taken whenever they come, and no answer at all is no fault.
    background: bool = False


@dataclass(frozen=True, slots=True)
class StreamClosePolicy:
    """A default plus per-exec-type overrides; ``default`` None = no opinion (defer to the next level)."""

    default: str | None = DEFAULT_POLICY
    by_exec: tuple[tuple[str, str], ...] = ()

    def get(self, kind: str) -> str | None:
        for k, v in self.by_exec:
            if k == kind:
                return v
        return self.default


def _check(value: Any, where: str) -> str:
    if value not in POLICIES:
        raise ValueError(f"{where}: stream_close must be one of {', '.join(POLICIES)}, not {value!r}")
    return str(value)


def _check_kind(kind: str, where: str) -> str:
    if kind not in EXEC_TYPES:
        raise ValueError(f"{where}: unknown exec type {kind!r} (known: {', '.join(EXEC_TYPES)})")
    return kind


def parse_policy(value: Any, where: str) -> StreamClosePolicy:
    """A scenario's ``stream_close``: ``"required"`` or ``{"default": …, "shell_stream": …}``."""
    if isinstance(value, str):
        return StreamClosePolicy(_check(value, where))
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{where}: stream_close is a policy ({', '.join(POLICIES)}) or an object "
                         f"{{\"default\": …, \"<exec type>\": …}}")
    default = _check(value["default"], where) if "default" in value else None
    by_exec = tuple((_check_kind(k, where), _check(v, f"{where}.{k}")) for k, v in value.items() if k != "default")
    return StreamClosePolicy(default, by_exec)


def server_policy(default: str = DEFAULT_POLICY, pairs: Iterable[str] = ()) -> StreamClosePolicy:
    """The server's policy from ``--stream-close`` and ``--exec-stream-close KIND=POLICY`` values."""
    by_exec = []
    for pair in pairs:
        kind, sep, policy = pair.partition("=")
        if not sep:
            raise ValueError(f"--exec-stream-close {pair!r}: write KIND=POLICY, e.g. shell_stream=required")
        by_exec.append((_check_kind(kind.strip(), "--exec-stream-close"),
                        _check(policy.strip(), f"--exec-stream-close {kind.strip()}")))
    return StreamClosePolicy(_check(default, "--stream-close"), tuple(by_exec))


def resolve(kind: str, step: str | None, scenario: StreamClosePolicy | None, server: StreamClosePolicy) -> str:
    """The policy for one exec: step, then scenario, then server."""
    if step is not None:
        return step
    if scenario is not None and (found := scenario.get(kind)) is not None:
        return found
    return server.get(kind) or DEFAULT_POLICY


def exec_numeric_id_of(m: Any) -> int | None:
    """The exec id an AgentClientMessage answers (result or control message), else None."""
    c = client_message_correlation(m)
    return c.id if c is not None and c.family == "exec" else None


class ExecWait:
    """One exec's answers under one policy, fed message by message; faults go to ``faults``."""

    def __init__(self, record: ExecRecord, policy: str, faults: list[str]) -> None:
        self.rec = record
        self.policy = record.policy = policy
        self.faults = faults
        self.results: list[Any] = []
        self.done = False
        self._final_event = False  # a shell stream's exit (or other final event) arrived
        self._final_result = False  # the shell_result after it arrived

    @property
    def waiting_for(self) -> str:
        r = self.rec
        needs = "stream_close" if self.results and self.policy == REQUIRED else "result"
        if r.kind == "shell_stream" and self.results and self.policy != REQUIRED:
            needs = "exit"
        return f"exec {r.id} ({r.kind}) {needs}"

    def concerns(self, m: Any) -> bool:
        """Is ``m`` an answer to this exec that the policy listens to?"""
        if exec_numeric_id_of(m) != self.rec.id:
            return False
        if self.policy == IGNORED and m.WhichOneof("message") == "exec_client_control_message":
            return m.exec_client_control_message.WhichOneof("message") == "throw"
        return True

    def feed(self, m: Any) -> None:
        """An answer while the exec is open."""
        if m.WhichOneof("message") == "exec_client_message":
            self._result(m.exec_client_message)
            return
        ctl = m.exec_client_control_message
        if ctl.WhichOneof("message") == "throw":
            self.rec.thrown = ctl.throw.error or "(no message)"
            self.done = True
            return
        self.rec.closed = True
        if not self.results:
            self.faults.append(f"exec {self.rec.id}: stream_close without any result")
        self.done = True

    def absorb(self, m: Any) -> bool:
        """Consume ``m`` outside the wait for this exec: anything after completion, and a
        ``stream_close`` the ``ignored`` policy does not listen to. False: leave it to ``feed``."""
        if exec_numeric_id_of(m) != self.rec.id:
            return False
        if self.done:
            self.late(m)
            return True
        if self.rec.background and self.concerns(m):  # nobody waits on it: take the answer as it comes
            self.feed(m)
            return True
        if not self.concerns(m):  # ignored policy: a stream_close is noted, never matched
            self.rec.closed = True
            return True
        return False

    def late(self, m: Any) -> None:
        """An answer after the exec completed (or was aborted): welcome, dropped, or a fault."""
        r = self.rec
        if r.aborted:
            return  # the server gave up on it: whatever still comes is dropped, not reported
        if m.WhichOneof("message") == "exec_client_control_message":
            member = m.exec_client_control_message.WhichOneof("message")
            if member == "stream_close" and not r.closed:
                r.closed = True
            elif member == "stream_close":
                self.faults.append(f"exec {r.id}: second stream_close")
            elif member == "throw":
                self.faults.append(f"exec {r.id} ({r.kind}): throw after the exec completed")
            return
        ecm = m.exec_client_message
        if self._final_event and not self._final_result and ecm.WhichOneof("result") == "shell_result":
            self._final_result = True
            r.results += 1
            return
        self.faults.append(f"exec {r.id} ({r.kind}): {ecm.WhichOneof('result') or 'empty result'} "
                           "after the exec completed")

    def abort(self) -> None:
        self.rec.aborted = True
        self.done = True

    def _result(self, ecm: Any) -> None:
        r = self.rec
        got = ecm.WhichOneof("result")
        final_shell = r.kind == "shell_stream" and got == "shell_result" and self._final_event
        if got != f"{r.kind}_result" and not final_shell:
            self.faults.append(f"exec {r.id} ({r.kind}) answered with {got or 'no result member'}")
        if ecm.exec_id != r.exec_id:
            self.faults.append(f"exec {r.id}: exec_id {ecm.exec_id!r} not echoed (sent {r.exec_id!r})")
        self.results.append(ecm)
        r.results += 1
        if final_shell:
            self._final_result = True
        elif r.kind == "shell_stream" and got == "shell_stream_result":
            if ecm.shell_stream_result.WhichOneof("event") not in _FINAL_EVENTS:
                return  # output still streaming
            self._final_event = True
        elif r.kind == "shell_stream":
            self._final_event = True  # answered at once (not as a stream): nothing more to wait for
        if self.policy != REQUIRED:
            self.done = True
