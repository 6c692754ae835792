"""The stream-json source of the healthy-traffic matrix prints our client's turns in the CLI's forms
(``tests/clients/stream_json_reporter.py``). It is only a fair source if it really mixes the forms
a naive consumer trips on (increments, segment snapshots, the whole message) and a correct consumer
rebuilds the turn's text from it; checked here with the importer's own text helpers, no network."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))

from stream_json_reporter import camel_tool_key, stream_json_lines  # noqa: E402

from workbench.client.events import (  # noqa: E402
    Error,
    ExecHandled,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    TurnEnded,
    TurnResult,
    Usage,
)
from workbench.protocol.stream_json import (  # noqa: E402
    assistant_form,
    naive_assistant_text,
    reconstruct_assistant_text,
)


def _turn(error: Error | None = None) -> TurnResult:
    events = [ThinkingDelta("Look first. "), TextDelta("I'll read"), TextDelta(" the file."),
              ExecHandled(1, "e-1", "read", True, "12 lines"),
              ToolCall("toolu_1\nfc_1", "read", {"path": "README.md"}, "e-1", "read"),
              TextDelta("It says"), TextDelta(" hello.")]
    if error is None:
        events.append(TurnEnded(Usage(output_tokens=7)))
    else:
        events.append(error)
    return TurnResult(text="I'll read the file.It says hello.", usage=Usage(output_tokens=7), ended=error is None,
                      error=error, request_id="r-1", events=events)  # type: ignore[arg-type]


def _events(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines]


def test_a_turn_mixes_the_cli_forms_and_rebuilds_to_its_text() -> None:
    evs = _events(stream_json_lines("read it", _turn(), session_id="s-1", cwd="/w", model="m", start_ms=1000,
                                    end_ms=2000))
    kinds = [e["type"] + ("." + e["subtype"] if "subtype" in e else "") for e in evs]
    assert kinds[:3] == ["system.init", "user", "thinking.delta"]
    assert kinds[-1] == "result.success"
    assistant = [e for e in evs if e["type"] == "assistant"]
    assert [assistant_form(e) for e in assistant] == ["delta", "delta", "snapshot", "delta", "delta", "snapshot",
                                                      "full"]
    final = "I'll read the file.\n\nIt says hello."
    assert reconstruct_assistant_text(assistant) == final
    assert naive_assistant_text(assistant) != final  # a naive consumer would duplicate: the source is not trivial
    assert evs[-1]["result"] == final
    assert evs[-1]["request_id"] == "r-1"
    calls = [e for e in evs if e["type"] == "tool_call"]
    assert [(e["subtype"], e["call_id"]) for e in calls] == [("started", "toolu_1\nfc_1"), ("completed", "toolu_1\nfc_1")]
    assert calls[1]["tool_call"]["readToolCall"]["result"] == {"success": {"kind": "read", "detail": "12 lines"}}
    assert kinds.index("tool_call.started") > kinds.index("thinking.completed")
    stamps = [e["timestamp_ms"] for e in evs if "timestamp_ms" in e]
    assert stamps == sorted(stamps)
    assert 1000 < stamps[0]
    assert stamps[-1] <= 2000
    assert {e["session_id"] for e in evs} == {"s-1"}


def test_a_failed_turn_ends_with_an_error_result() -> None:
    evs = _events(stream_json_lines("read it", _turn(Error("resource_exhausted", "usage limit")), session_id="s-2",
                                    cwd="/w", model="m", start_ms=0, end_ms=10))
    assert evs[-1]["subtype"] == "error"
    assert evs[-1]["is_error"] is True
    assert evs[-1]["error"] == {"message": "usage limit", "code": "resource_exhausted"}


def test_tool_keys_are_the_clis_camel_case() -> None:
    assert camel_tool_key("shell", "shell") == "shellToolCall"
    assert camel_tool_key("web_search", "") == "webSearchToolCall"
    assert camel_tool_key("", "mcp") == "mcpToolCall"
