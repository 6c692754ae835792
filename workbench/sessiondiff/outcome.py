"""What the two sessions did and how they ended: execs, tool calls, endings, findings, the stall.

Each is compared once over the whole session (dictionaries, no pairwise search): linear.
An agent run ends with ``turn_ended`` and the end of the stream; an OpenAI exchange with a
``finish_reason`` (or a Responses ``status``) and ``data: [DONE]``: each is described in its own terms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from workbench.nesting import load_json
from workbench.protocol import kinds
from workbench.report.session import SessionView
from workbench.report.shape import Exec, execs, find_stall
from workbench.sessiondiff.model import Diff, Options, add
from workbench.sessiondiff.trees import flatten, shown


def _pair_by_name(xs: Sequence[Any], ys: Sequence[Any], name: Callable[[Any], str]
                  ) -> Iterator[tuple[Any | None, Any | None, int]]:
    """Pair the n-th element named N in ``xs`` with the n-th named N in ``ys``; (x, y, n)."""
    seen: dict[str, int] = {}
    by_b: dict[tuple[str, int], Any] = {}
    for y in ys:
        k = name(y)
        by_b[(k, seen.get(k, 0))] = y
        seen[k] = seen.get(k, 0) + 1
    seen.clear()
    for x in xs:
        k = name(x)
        n = seen.get(k, 0)
        seen[k] = n + 1
        yield x, by_b.pop((k, n), None), n + 1
    for (_k, n), y in sorted(by_b.items(), key=lambda kv: kv[1].request_seq if isinstance(kv[1], Exec) else 0):
        yield None, y, n + 1


def _ended_at(e: Exec) -> int:
    """Where an exec's ending is (or would be): its close, throw or abort, else after its last result."""
    for seq in (e.close_seq, e.throw_seq, e.abort_seq):
        if seq is not None:
            return seq
    return e.results[-1][0] + 1 if e.results else e.request_seq + 1


def compare_execs(d: Diff) -> None:
    for x, y, n in _pair_by_name(execs(d.a.frames), execs(d.b.frames), lambda e: e.name):
        if y is None:
            assert x is not None
            add(d, "exec", f"exec {x.name} #{n}: only in A (exec {x.ref_id}, seq {x.request_seq})",
                at=x.request_seq, exec=x.name, a_seq=x.request_seq)
            continue
        if x is None:
            add(d, "exec", f"exec {y.name} #{n}: only in B (exec {y.ref_id}, seq {y.request_seq})",
                exec=y.name, b_seq=y.request_seq)
            continue
        head = f"exec {x.name} #{n} (A exec {x.ref_id} at seq {x.request_seq}, B exec {y.ref_id} at seq {y.request_seq})"
        ra, rb = [k for _, k in x.results], [k for _, k in y.results]
        if ra != rb:
            add(d, "exec", f"{head}: answered with {ra or 'nothing'} in A, {rb or 'nothing'} in B",
                at=x.results[0][0] if x.results else x.request_seq, exec=x.name, a_seq=x.request_seq, b_seq=y.request_seq)
        if x.ending != y.ending:
            if x.close_seq is not None and y.close_seq is None:
                what = f"stream_close only in A (seq {x.close_seq}); B: {y.ending}"
            elif y.close_seq is not None and x.close_seq is None:
                what = f"stream_close only in B (seq {y.close_seq}); A: {x.ending}"
            else:
                what = f"ended with {x.ending} in A, {y.ending} in B"
            add(d, "exec", f"{head}: {what}", at=_ended_at(x), exec=x.name, a_seq=x.request_seq,
                b_seq=y.request_seq, a_ending=x.ending, b_ending=y.ending,
                missing=kinds.EXEC_STREAM_CLOSE if (x.close_seq is None) != (y.close_seq is None) else None)


def _norm_args(text: Any, opts: Options) -> Any:
    if text is None:
        return None
    value = text
    if isinstance(text, str | bytes):  # stored rows keep JSON text; the analysis gives objects
        try:
            value = load_json(text)
        except ValueError:  # not JSON, or nested past the one limit (workbench.nesting)
            return text
    return {p: v for p, v, _ in flatten(value, opts)} if isinstance(value, dict | list) else value


def _beyond(calls: list[dict[str, Any]], keys: list[str], matched: Counter[str]) -> list[dict[str, Any]]:
    """The calls left once ``matched[k]`` of each key ``k`` are taken out."""
    left = Counter(matched)
    out = []
    for c, k in zip(calls, keys, strict=True):
        if left[k]:
            left[k] -= 1
        else:
            out.append(c)
    return out


_ARGS = ("args_merged", "args_streamed", "args_completion")


def compare_tools(d: Diff, opts: Options) -> None:
    def name(c: dict[str, Any]) -> str:
        return str(c.get("tool_name") or "?")

    def same_call(c: dict[str, Any]) -> str:
        return repr((name(c), c.get("status"), [_norm_args(c.get(k), opts) for k in _ARGS]))

    # a call found the same on both sides is not compared again, wherever it is (a step that moved)
    ka = [same_call(c) for c in d.a.tool_calls]
    kb = [same_call(c) for c in d.b.tool_calls]
    both = Counter(ka) & Counter(kb)
    rest_a, rest_b = _beyond(d.a.tool_calls, ka, both), _beyond(d.b.tool_calls, kb, both)
    for x, y, n in _pair_by_name(rest_a, rest_b, name):
        if x is None or y is None:
            c = x or y
            assert c is not None
            side = "A" if x is not None else "B"
            add(d, "tool_call", f"tool call {name(c)} #{n}: only in {side} ({c.get('call_id')})", tool=name(c))
            continue
        for key in _ARGS:
            va, vb = _norm_args(x.get(key), opts), _norm_args(y.get(key), opts)
            if va != vb:
                add(d, "tool_args", f"tool call {name(x)} #{n} {key}: {shown(x.get(key))} → {shown(y.get(key))}",
                    tool=name(x), field=key, a=x.get(key), b=y.get(key))
        if x.get("status") != y.get("status"):
            add(d, "tool_call", f"tool call {name(x)} #{n} status: {x.get('status')} → {y.get('status')}",
                tool=name(x), a=x.get("status"), b=y.get("status"))


def _last_kind(v: SessionView) -> str:
    return next((f.kind for f in reversed(v.frames) if not kinds.is_heartbeat(f.kind)), "no frame")


def _is_openai(v: SessionView) -> bool:
    return bool(v.frames) and kinds.is_openai(v.frames[0].kind)


# the names the agent ending comparison gives the two kinds it looks for (text and JSON keys)
_END, _TURN = kinds.END_STREAM, kinds.member(kinds.TURN_ENDED)


def _agent_ending(v: SessionView) -> tuple[dict[str, Any], str]:
    seen = {f.kind for f in v.frames}
    end = any(kinds.is_end_stream(k) for k in seen)
    turn = kinds.TURN_ENDED in seen
    last = _last_kind(v)
    return ({_END: end, _TURN: turn, "last_kind": last},
            f"{'' if turn else 'no '}{_TURN}, {'' if end else 'no '}{_END}, last {last}")


def _openai_ending(v: SessionView) -> tuple[dict[str, Any], str]:
    """finish_reason (a Responses status), ``[DONE]``, an error, the last frame: an OpenAI answer's ending."""
    finish = [f.summary for f in v.frames if f.kind == kinds.OPENAI_FINISH]
    done = any(f.kind == kinds.OPENAI_DONE for f in v.frames)
    errors = sum(1 for f in v.frames if f.kind == kinds.OPENAI_ERROR)
    last = _last_kind(v)
    said = finish[-1].removeprefix("finish ") if finish else None
    text = (f"{'finish_reason ' + said if said else 'no finish_reason'}, {'' if done else 'no '}[DONE]"
            + (f", {errors} error{'s' if errors != 1 else ''}" if errors else "") + f", last {last}")
    return {"finish": said, "done": done, "errors": errors, "last_kind": last}, text


def compare_ending(d: Diff) -> None:
    sa, sb = str(d.a.facts.get("status") or "?"), str(d.b.facts.get("status") or "?")
    if sa != sb:
        add(d, "ending", f"status: {sa} in A, {sb} in B", a=sa, b=sb)
    ea = _openai_ending(d.a) if _is_openai(d.a) else _agent_ending(d.a)
    eb = _openai_ending(d.b) if _is_openai(d.b) else _agent_ending(d.b)
    if ea[0] != eb[0]:
        add(d, "ending", f"ending: {ea[1]} in A; {eb[1]} in B", a=ea[0], b=eb[0])


def compare_findings(d: Diff) -> None:
    def codes(v: SessionView) -> dict[str, str]:
        return {str(f["code"]): str(f["severity"]) for f in v.findings}

    ca, cb = codes(d.a), codes(d.b)
    for code in sorted(ca.keys() - cb.keys()):
        add(d, "finding", f"finding only in A: {code} ({ca[code]})", protocol=False, code=code, side="a",
            severity=ca[code])
    for code in sorted(cb.keys() - ca.keys()):
        add(d, "finding", f"finding only in B: {code} ({cb[code]})", protocol=False, code=code, side="b",
            severity=cb[code])


def compare_stalls(d: Diff) -> None:
    sa, sb = find_stall(d.a.frames), find_stall(d.b.frames)
    d.stall = {"a": sa.as_dict() if sa else None, "b": sb.as_dict() if sb else None}
    for side, s, other in (("A", sa, sb), ("B", sb, sa)):
        if s is not None and other is None:
            add(d, "stall", f"{side}: {s.describe()}", protocol=False, side=side.lower(), **s.as_dict())
