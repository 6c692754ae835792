"""Scenarios: what the simulated backend does in a turn, as data (one JSON file per scenario).

A scenario is ``{"description": …, "steps": [...], "continuation": [...], "on_reuse": [...]}``
(plus ``stream_close``, the scenario's exec-completion policy, ``prelude``, the steps a fresh
run resuming from a client's history replays first, and ``wait_for_request_context``, whether its
request_context steps hold the run until the client answers);
each step is an object whose first key is its verb (see ``VERBS`` and docs/sim.md). The built-in
files live in ``workbench/sim/scenarios/``; ``--scenario-dir`` folders add to (or override) them.
Files are validated when loaded, so a typo fails at start-up with the file and step named, not
in the middle of somebody's turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.jsontypes import JsonObject
from workbench.protocol.labels import scenario_in
from workbench.sim.exec_completion import POLICIES, StreamClosePolicy, parse_policy

BUILTIN_DIR = Path(__file__).resolve().parent / "scenarios"
DEFAULT_SCENARIO = "text"

EXEC_KINDS = ("shell", "shell_stream", "read", "ls", "grep", "write", "delete", "mcp")
ENDINGS = ("ok", "eof", "goaway", "reset")
KV_BLOBS = ("system", "user", "assistant_text", "assistant_tool_call", "tool_result")

# verb → allowed option keys (besides the verb itself)
VERBS: dict[str, frozenset[str]] = {
    "kv_set": frozenset({"text"}),
    "kv_get": frozenset({"max"}),
    "http_status": frozenset({"code", "message"}),
    "bad_length_prefix": frozenset({"off_by"}),
    "unknown_exec": frozenset(),
    "request_context": frozenset({"stream_close", "wait"}),
    "thinking": frozenset({"chunks", "duration_ms"}),
    "text": frozenset({"chunks"}),
    "tool": frozenset(),
    "web_search": frozenset(),
    "heartbeats": frozenset(),
    "checkpoint": frozenset(),
    "step_completed": frozenset(),
    "turn_ended": frozenset(),
    "await_followup": frozenset(),
    "park": frozenset(),
    "pause": frozenset(),
    "end_stream_error": frozenset(),
    "end": frozenset(),
}
TOOL_KEYS = frozenset({"exec", "args", "partial_snapshots", "client_tools", "mcp_tool", "completion",
                       "require_stream_close", "stream_close", "then", "output_deltas",
                       "checkpoint_before_exec", "abort_after", "resume_at"})
ERROR_KEYS = frozenset({"code", "message", "error", "title", "detail", "is_retryable", "is_expected"})


class ScenarioError(WorkbenchError):
    """A scenario file or name is wrong; the message names the file/step or the name."""


@dataclass(slots=True)
class Scenario:
    name: str
    description: str
    steps: list[JsonObject]
    continuation: list[JsonObject] | None = None
    on_reuse: list[JsonObject] | None = None
    stream_close: StreamClosePolicy | None = None  # None: the server's policy
    prelude: int | None = None  # None: the leading kv_set/kv_get steps
    wait_for_request_context: bool | None = None  # None: the server's (--strict-request-context)
    path: Path | None = None
    extra: JsonObject = field(default_factory=dict)


def verb_of(step: Mapping[str, Any]) -> str:
    return next(iter(step))


def _check_steps(steps: Any, where: str) -> list[JsonObject]:
    if not isinstance(steps, list):
        raise ScenarioError(f"{where}: must be a list of steps")
    out = []
    for i, step in enumerate(steps):
        at = f"{where}[{i}]"
        if not isinstance(step, dict) or not step:
            raise ScenarioError(f"{at}: a step is a non-empty object like {{\"text\": \"…\"}}")
        verb = verb_of(step)
        if verb not in VERBS:
            raise ScenarioError(f"{at}: unknown verb {verb!r} (known: {', '.join(VERBS)})")
        extra = set(step) - {verb} - VERBS[verb]
        if extra:
            raise ScenarioError(f"{at}: {verb} does not take {', '.join(sorted(extra))}")
        value = step[verb]
        if verb == "kv_set" and value not in KV_BLOBS:
            raise ScenarioError(f"{at}: kv_set must be one of {', '.join(KV_BLOBS)}, not {value!r}")
        if verb == "kv_get" and value not in ("state", "missing", "own"):
            raise ScenarioError(f"{at}: kv_get must be \"state\", \"missing\" or \"own\", not {value!r}")
        if verb == "http_status" and not (isinstance(value, int) and 200 < value < 600 and i == 0):
            raise ScenarioError(f"{at}: http_status takes a non-200 status (201-599) and must be the first step")
        if verb == "bad_length_prefix" and not isinstance(value, str):
            raise ScenarioError(f"{at}: bad_length_prefix takes the text of the misframed text_delta")
        if verb == "bad_length_prefix" and not (isinstance(step.get("off_by", 5), int) and step.get("off_by", 5)):
            raise ScenarioError(f"{at}: bad_length_prefix.off_by is a non-zero number of bytes")
        if verb == "unknown_exec" and not (isinstance(value, int) and 1 <= value < 2**29
                                           and value not in _known_exec_fields() and not 19000 <= value < 20000):
            raise ScenarioError(f"{at}: unknown_exec takes a field number ExecServerMessage does not have "
                                f"(1 to 2^29-1, not 19000-19999, not one of {sorted(_known_exec_fields())})")
        if verb in ("thinking", "text", "web_search") and not isinstance(value, str):
            raise ScenarioError(f"{at}: {verb} takes a string")
        if verb in ("heartbeats",) and not (isinstance(value, int) and value >= 0):
            raise ScenarioError(f"{at}: heartbeats takes a count >= 0")
        if verb == "pause" and not (isinstance(value, int | float) and value >= 0):
            raise ScenarioError(f"{at}: pause takes seconds >= 0")
        if verb == "end" and value not in ENDINGS:
            raise ScenarioError(f"{at}: end must be \"ok\" (end-stream {{}}), \"goaway\" (end-stream, then "
                                f"GOAWAY), \"eof\" (no end-stream) or \"reset\" (RST_STREAM)")
        if verb == "end_stream_error":
            if not isinstance(value, dict) or "code" not in value:
                raise ScenarioError(f"{at}: end_stream_error needs at least {{\"code\": …}}")
            bad = set(value) - ERROR_KEYS
            if bad:
                raise ScenarioError(f"{at}: end_stream_error does not take {', '.join(sorted(bad))}")
        if verb == "tool":
            _check_tool(value, at, len(steps))
        if verb == "request_context" and not isinstance(step.get("wait", False), bool):
            raise ScenarioError(f"{at}: request_context.wait is true (hold the run for the answer) or false")
        if "stream_close" in step or (verb == "tool" and isinstance(value, dict) and "stream_close" in value):
            policy = step.get("stream_close", value.get("stream_close") if isinstance(value, dict) else None)
            if policy not in POLICIES:
                raise ScenarioError(f"{at}: stream_close must be one of {', '.join(POLICIES)}, not {policy!r}")
        out.append(step)
    return out


def _known_exec_fields() -> set[int]:
    from workbench.schema import pb  # deferred: the loader stays light for --list-scenarios

    return {f.number for f in pb.ExecServerMessage.DESCRIPTOR.fields}


def _check_tool(spec: Any, at: str, n_steps: int) -> None:
    if not isinstance(spec, dict):
        raise ScenarioError(f"{at}: tool takes an object with at least \"exec\"")
    bad = set(spec) - TOOL_KEYS
    if bad:
        raise ScenarioError(f"{at}: tool does not take {', '.join(sorted(bad))}")
    if spec.get("exec") not in EXEC_KINDS:
        raise ScenarioError(f"{at}: tool.exec must be one of {', '.join(EXEC_KINDS)}, not {spec.get('exec')!r}")
    if not isinstance(spec.get("args", {}), dict):
        raise ScenarioError(f"{at}: tool.args must be an object (the model's arguments)")
    if spec.get("client_tools", "auto") not in ("auto", "keep_args", "never"):
        raise ScenarioError(f"{at}: tool.client_tools must be auto, keep_args or never")
    abort_after = spec.get("abort_after")
    if abort_after is not None and not (isinstance(abort_after, int | float) and abort_after >= 0):
        raise ScenarioError(f"{at}: tool.abort_after takes seconds >= 0")
    if spec.get("then", "continue") not in ("continue", "reuse"):
        raise ScenarioError(f"{at}: tool.then must be continue or reuse")
    resume_at = spec.get("resume_at")
    if resume_at is not None and not (isinstance(resume_at, int) and 0 <= resume_at <= n_steps):
        raise ScenarioError(f"{at}: tool.resume_at is the index of a step in this list (0–{n_steps})")
    if "stream_close" in spec and "require_stream_close" in spec:
        raise ScenarioError(f"{at}: give tool.stream_close or the older require_stream_close, not both")


def parse_scenario(doc: Any, name: str, path: Path | None = None) -> Scenario:
    where = str(path) if path else name
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: a scenario is a JSON object with \"steps\"")
    if "name" in doc and doc["name"] != name:
        raise ScenarioError(f"{where}: \"name\" is {doc['name']!r} but the file name says {name!r}")
    if "steps" not in doc:
        raise ScenarioError(f"{where}: missing \"steps\"")
    known = {"name", "description", "steps", "continuation", "on_reuse", "stream_close", "prelude",
             "wait_for_request_context"}
    try:
        policy = parse_policy(doc["stream_close"], f"{where}: stream_close") if "stream_close" in doc else None
    except ValueError as exc:
        raise ScenarioError(str(exc)) from exc
    steps = _check_steps(doc["steps"], f"{where}: steps")
    wait_ctx = doc.get("wait_for_request_context")
    if wait_ctx is not None and not isinstance(wait_ctx, bool):
        raise ScenarioError(f"{where}: wait_for_request_context is true or false, not {wait_ctx!r}")
    prelude = doc.get("prelude")
    if prelude is not None and not (isinstance(prelude, int) and 0 <= prelude <= len(steps)):
        raise ScenarioError(f"{where}: prelude is a number of leading steps (0–{len(steps)})")
    return Scenario(
        name=name,
        description=str(doc.get("description", "")),
        steps=steps,
        continuation=_check_steps(doc["continuation"], f"{where}: continuation") if "continuation" in doc else None,
        on_reuse=_check_steps(doc["on_reuse"], f"{where}: on_reuse") if "on_reuse" in doc else None,
        stream_close=policy,
        prelude=prelude,
        wait_for_request_context=wait_ctx,
        path=path,
        extra={k: v for k, v in doc.items() if k not in known},
    )


def load_file(path: Path) -> Scenario:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not valid JSON: {exc}") from exc
    return parse_scenario(doc, path.stem, path)


def load_scenarios(extra_dirs: Iterable[str | Path] = ()) -> dict[str, Scenario]:
    """The built-in scenarios plus every ``*.json`` in ``extra_dirs`` (later dirs win)."""
    out: dict[str, Scenario] = {}
    for d in [BUILTIN_DIR, *map(Path, extra_dirs)]:
        if not d.is_dir():
            raise ScenarioError(f"scenario dir {d} does not exist or is not a directory")
        for path in sorted(d.glob("*.json")):
            out[path.stem] = load_file(path)
    return out


def unknown_scenario_message(name: str, available: Iterable[str]) -> str:
    return f"unknown scenario {name!r} (available: {', '.join(sorted(available))})"


def marker_in(text: str) -> str | None:
    """The scenario a prompt's ``[scenario:NAME]`` marker selects (``workbench.protocol.labels``)."""
    return scenario_in(text)
