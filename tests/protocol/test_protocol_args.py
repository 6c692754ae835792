"""Tool-call argument reconstruction (workbench.protocol.args): pure functions."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from workbench.protocol import args as tool_args

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
objects = st.dictionaries(st.text(min_size=1, max_size=10), json_values, min_size=1, max_size=6)


def snapshots(text: str, cuts: list[int]) -> list[str]:
    points = sorted({max(1, min(len(text), c)) for c in cuts} | {len(text)})
    return [text[:p] for p in points]


@given(objects, st.lists(st.integers(0, 10_000), max_size=8))
def test_cumulative_snapshots_rebuild_the_exact_text(doc: dict, cuts: list[int]) -> None:
    text = json.dumps(doc)
    snaps = snapshots(text, cuts)
    assert tool_args.accumulate_all(snaps) == text
    assert json.loads(tool_args.accumulate_all(snaps)) == doc


@given(objects, st.lists(st.integers(1, 10_000), min_size=1, max_size=8))
def test_naive_concat_garbles_cumulative_snapshots(doc: dict, cuts: list[int]) -> None:
    text = json.dumps(doc)
    snaps = snapshots(text, cuts)
    if len(snaps) > 1:
        assert tool_args.naive_concat(snaps) != text
        assert tool_args.parse_args_text(tool_args.naive_concat(snaps)) != doc


def test_increments_are_appended() -> None:
    assert tool_args.accumulate_all(['{"pa', 'th": "', 'x.txt"}']) == '{"path": "x.txt"}'
    # the garbled shape docs/protocol.md §7 (args_cumulative_snapshots) describes
    assert tool_args.naive_concat(['{"pa', '{"path":']) == '{"pa{"path":'
    assert tool_args.accumulate_args_text("abc", "") == "abc"


def test_merge_keeps_streamed_keys_and_structured_values() -> None:
    streamed = {"description": "d", "tasks": [{"id": 1}], "options": {"parallel": True}}
    completion = {"description": "d2", "options": '{"parallel": true}', "extra": 3}
    merged = tool_args.merge_mcp_args(streamed, completion)
    assert merged == {"description": "d2", "tasks": [{"id": 1}], "options": {"parallel": True}, "extra": 3}
    assert tool_args.merge_mcp_args(None, completion) == completion
    assert tool_args.merge_mcp_args(streamed, None) == streamed
    # a string that the stream also had as a string: the completion wins
    assert tool_args.merge_mcp_args({"a": "x"}, {"a": "y"}) == {"a": "y"}


@given(objects, objects)
def test_merge_never_loses_a_key(streamed: dict, completion: dict) -> None:
    merged = tool_args.merge_mcp_args(streamed, completion)
    assert set(merged) == set(streamed) | set(completion)
    for k, v in streamed.items():
        if k not in completion or (not isinstance(v, str) and isinstance(completion[k], str)):
            assert merged[k] == v


@given(objects)
def test_mcp_args_round_trip(doc: dict) -> None:
    assert tool_args.mcp_args_to_json(tool_args.json_to_mcp_args(doc)) == doc


def test_mcp_value_falls_back_to_utf8() -> None:
    assert tool_args.mcp_args_to_json({"a": b"plain text value", "b": tool_args.encode_value([1, 2.5])}) == {
        "a": "plain text value", "b": [1, 2.5]}
    assert tool_args.decode_value(b"") is None


# snapshots and increments ----------------------------------------------------------------------

@given(st.text(max_size=200), st.integers(1, 12))
def test_the_services_snapshots_rebuild_the_text_and_naive_concat_shows_its_junctions(text: str, n: int) -> None:
    snaps = tool_args.snapshots(text, n)
    assert snaps[-1] == text or (not text and snaps == [""])
    assert all(b.startswith(a) for a, b in zip(snaps, snaps[1:], strict=False))
    assert tool_args.accumulate_all(snaps) == text
    naive = tool_args.naive_concat(snaps)
    for junction in tool_args.naive_junctions(snaps):
        assert junction in naive


@given(st.lists(st.text(min_size=1, max_size=12), max_size=10))
def test_increments_accumulate_like_concatenation_unless_one_repeats_the_text_so_far(parts: list[str]) -> None:
    """A true increment is appended; the rule cannot tell one that happens to start with all the text
    so far from a snapshot (it takes it as a snapshot), so the property holds outside that case."""
    text = ""
    ambiguous = False
    for p in parts:
        ambiguous = ambiguous or p.startswith(text)
        text += p
    if not ambiguous:
        assert tool_args.accumulate_all(parts) == "".join(parts)


@given(st.lists(st.text(max_size=12), max_size=10))
def test_accumulating_step_by_step_equals_accumulate_all(deltas: list[str]) -> None:
    text = ""
    for d in deltas:
        text = tool_args.accumulate_args_text(text, d)
    assert text == tool_args.accumulate_all(deltas)


def test_no_junctions_without_snapshots() -> None:
    assert tool_args.naive_junctions(["ab", "cd", "ef"]) == []
    assert tool_args.naive_junctions(['{"pa', '{"path": 1}'], width=3) == ['"pa{"p']


@given(objects, objects)
def test_the_merge_keeps_every_key_and_never_trades_structure_for_a_string(streamed: dict, completion: dict) -> None:
    merged = tool_args.merge_mcp_args(streamed, completion)
    assert set(merged) == set(streamed) | set(completion)
    for key, value in merged.items():
        if key in streamed and key in completion and not isinstance(streamed[key], str) \
                and isinstance(completion[key], str):
            assert value == streamed[key]
        elif key in completion:
            assert value == completion[key]


def test_parse_json_takes_any_json() -> None:
    assert tool_args.parse_json("[1, 2]") == [1, 2]
    assert tool_args.parse_json('{"a"') is None
    assert tool_args.parse_json(None) is None
    assert tool_args.parse_args_text("[1, 2]") is None  # args are an object
