"""Scenario steps that hand work to the client and wait for its answer: ``tool`` (a tool call with
its exec), ``request_context`` and ``web_search`` (an interaction query).

An exec is complete when its stream_close policy says so (``exec_completion``: step, then scenario,
then server); while the run waits it heartbeats (``client_link``). A ``tool`` step streams the
call the way the real server does — partial_tool_call snapshots, tool_call_started, the exec,
optional shell output deltas, tool_call_completed — with the messages built by ``tools``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from workbench.jsontypes import JsonObject
from workbench.protocol.args import snapshots
from workbench.schema import pb
from workbench.sim import history
from workbench.sim.blob_steps import checkpoint
from workbench.sim.client_link import TIMEOUT
from workbench.sim.exec_completion import REQUIRED, ExecRecord, ExecWait, resolve
from workbench.sim.run_context import RunContext, Step
from workbench.sim.tools import (
    TOOL_NAMES,
    attach_result,
    exec_message,
    fit_args,
    pick_tool,
    result_summary,
    tool_call,
)
from workbench.wire.varint import encode_varint


def next_exec(run: RunContext, kind: str) -> ExecRecord:
    run.exec_seq += 1
    er = ExecRecord(run.exec_seq, str(uuid.uuid4()), kind)
    run.rec.execs.append(er)
    return er


def policy_for(run: RunContext, kind: str, step_value: Any) -> str:
    assert run.scenario is not None
    return resolve(kind, step_value, run.scenario.stream_close, run.backend.policy)


async def await_exec(run: RunContext, er: ExecRecord, policy: str,
                     abort_after: float | None = None) -> tuple[list[Any], str | None]:
    """Wait for the client's answer to an exec until its policy says it is complete."""
    link = run.link
    w = link.waits[er.id] = ExecWait(er, policy, run.rec.faults)
    until = None if abort_after is None else link.loop.time() + abort_after
    while not w.done:
        m = await link.wait(w.concerns, w.waiting_for, until=until)
        if m is TIMEOUT:
            # The server gives up on the exec: abort{id}; whatever the client still sends for it
            # is dropped, not reported.
            await link.send(pb.AgentServerMessage(exec_server_control_message=pb.ExecServerControlMessage(
                abort=pb.ExecServerAbort(id=er.id))), "abort")
            w.abort()
            return w.results, f"aborted by the server after {abort_after:g} s"
        w.feed(m)
    return w.results, er.thrown


async def request_context(run: RunContext, _value: Any, step: JsonObject) -> None:
    """Ask the client for its context. The service does not hold the turn for the answer (clients
    that put their context in the run request never send one, and their turns complete), so by
    default neither does this step: the answer is taken whenever it comes (``context_tools``).
    ``waits_for_context`` says when it waits instead, as a server that parks on it would."""
    er = next_exec(run, "request_context")
    await run.link.send(pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
        id=er.id, exec_id=er.exec_id,
        request_context_args=pb.RequestContextArgs(workspace_id=str(uuid.uuid4())))), "request_context_args")
    policy = policy_for(run, "request_context", step.get("stream_close"))
    if waits_for_context(run, step, policy):
        results, _ = await await_exec(run, er, policy)
        _take_context(run, results)
        return
    er.background = True
    w = run.link.waits[er.id] = ExecWait(er, policy, run.rec.faults)
    run.context_waits.append(w)


def waits_for_context(run: RunContext, step: JsonObject, policy: str) -> bool:
    """Whether this request_context step holds the run until the answer: the step's ``wait``, the
    scenario's ``wait_for_request_context``, the server's ``strict_request_context``; else only under
    the ``required`` stream_close policy — the December 2025 service, which stalled on a
    request_context result sent without its stream_close, so it waited for that answer."""
    assert run.scenario is not None
    if "wait" in step:
        return bool(step["wait"])
    if run.scenario.wait_for_request_context is not None:
        return run.scenario.wait_for_request_context
    return run.cfg.strict_request_context or policy == REQUIRED


def _take_context(run: RunContext, results: list[Any]) -> None:
    for r in results:
        if r.WhichOneof("result") == "request_context_result" and r.request_context_result.HasField("success"):
            run.client_tools += list(r.request_context_result.success.request_context.tools)


async def context_tools(run: RunContext) -> None:
    """Before the model picks a tool: the tools of the request_context answers that have come.

    An answer still on its way gets a short grace (``request_context_grace``, once per run, and only
    when the run request carries no context of its own), so a client that does answer has its own
    tools used whatever the timing; its tools otherwise come from the run request.
    """
    link = run.link
    link.drain()
    if run.request.action.user_message_action.HasField("request_context"):
        run.context_grace_spent = True  # the run request carries the context: nothing to wait for
    for w in run.context_waits:
        if not w.done and not w.results and not run.context_grace_spent:
            run.context_grace_spent = True
            w.rec.background = False  # waited on for a moment: answers go to this wait, not absorbed
            until = link.loop.time() + run.cfg.request_context_grace
            try:
                while not w.done and not w.results:
                    m = await link.wait(w.concerns, w.waiting_for, until=until)
                    if m is TIMEOUT:
                        break
                    w.feed(m)
            finally:
                w.rec.background = True
        fresh = w.results[run.context_taken.get(w.rec.id, 0):]
        run.context_taken[w.rec.id] = len(w.results)
        _take_context(run, fresh)


async def unknown_exec(run: RunContext, field_number: int, step: JsonObject) -> None:
    """An exec whose args member is field ``field_number``, which the client's schema does not know
    (a case the service added later, pi-cursor #13). A client that throws completes it; one that
    cannot decode it and never answers leaves the run heartbeating (``--park-timeout``)."""
    er = next_exec(run, f"unknown_{field_number}")
    msg = pb.ExecServerMessage(id=er.id, exec_id=er.exec_id)
    # an unknown length-delimited field: the tag, then a small sub-message (field 1 = a call id)
    inner = b"\x0a" + encode_varint(len(er.exec_id)) + er.exec_id.encode()
    raw = bytes(msg.SerializeToString()) + encode_varint(field_number << 3 | 2) + encode_varint(len(inner)) + inner
    outer = pb.AgentServerMessage.DESCRIPTOR.fields_by_name["exec_server_message"].number
    await run.link.send(_Raw(encode_varint(outer << 3 | 2) + encode_varint(len(raw)) + raw),
                        f"exec_server_message.unknown_{field_number}")
    run.last_tool = {"name": f"unknown exec case {field_number}", "call_id": er.exec_id, "args": {}}
    _, thrown = await await_exec(run, er, policy_for(run, "mcp", None))
    run.last_tool["result"] = f"error: {thrown}" if thrown is not None else "(answered)"


class _Raw:
    """Already-serialized AgentServerMessage bytes, sent as they are (``ClientLink.send`` serializes)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf method name ClientLink calls
        return self.data



async def web_search(run: RunContext, term: str, step: JsonObject) -> None:
    """An interaction query the client must answer (same id) before the run goes on."""
    run.exec_seq += 1  # queries and execs draw ids from separate spaces upstream; one is enough here
    qid = run.exec_seq
    call_id = f"toolu_{uuid.uuid4().hex[:24]}"
    await run.link.send(pb.AgentServerMessage(interaction_query=pb.InteractionQuery(
        id=qid, web_search_request_query=pb.WebSearchRequestQuery(
            args=pb.WebSearchArgs(search_term=run.fmt(term), tool_call_id=call_id)))),
        "web_search_request_query")

    def answer(m: Any) -> bool:
        return m.WhichOneof("message") == "interaction_response" and m.interaction_response.id == qid

    resp = (await run.link.wait(answer, f"interaction_query {qid} response")).interaction_response
    member = resp.WhichOneof("response")
    if member != "web_search_request_response":
        run.rec.faults.append(f"interaction_query {qid}: answered with {member}, not web_search_request_response")
        result = f"answered with {member}"
    else:
        case = resp.web_search_request_response.WhichOneof("result")
        result = f"rejected: {resp.web_search_request_response.rejected.reason}" if case == "rejected" \
            else str(case or "no result")
    run.last_tool = {"name": "WebSearch", "call_id": call_id, "args": {"search_term": term}, "result": result}


async def tool(run: RunContext, spec: JsonObject, step: JsonObject) -> None:
    if run.resume:
        # Handed out by an earlier run of this turn: the "model" reads the result from the prompt.
        done = run.resume.pop(0)
        run.last_tool = {**done, "result": history.result_in_text(run.user_text, done["call_id"])}
        return
    link = run.link
    await context_tools(run)
    kind = spec["exec"]
    args = {k: run.fmt(v) if isinstance(v, str) else v for k, v in spec.get("args", {}).items()}
    policy = spec.get("client_tools", "auto")
    mcp_name = str(spec.get("mcp_tool", "workbench-sim___echo"))
    provider, _, tool_name = mcp_name.rpartition("___")
    if run.client_tools and policy != "never":
        offered = pick_tool(run.client_tools, kind, mcp_name)
        if policy == "auto":
            args = fit_args(args, offered)
        kind = "mcp"
        mcp_name = offered.name
        provider = offered.provider_identifier
        tool_name = offered.tool_name or offered.name
    call_id = f"toolu_{uuid.uuid4().hex[:24]}"
    model_call_id = str(uuid.uuid4())
    display = tool_name if kind == "mcp" else TOOL_NAMES[kind]
    run.last_tool = {"name": display, "call_id": call_id, "args": args}
    args_text = json.dumps(args, ensure_ascii=False)

    skeleton = tool_call(kind, {}, call_id, mcp_name, provider, tool_name, args_only_name=True)
    # cumulative snapshots, as the service streams args_text_delta (docs/protocol.md §5)
    n_snapshots = int(spec.get("partial_snapshots", 3))  # 0: the arguments come whole in tool_call_started
    for snap in snapshots(args_text, n_snapshots) if n_snapshots > 0 else []:
        await link.update("partial_tool_call", call_id=call_id, tool_call=skeleton, args_text_delta=snap,
                          model_call_id=model_call_id)
        await run.pace()
    started = tool_call(kind, args, call_id, mcp_name, provider, tool_name)
    await link.update("tool_call_started", call_id=call_id, tool_call=started, model_call_id=model_call_id)
    if spec.get("checkpoint_before_exec"):
        part = {"type": "tool-call", "toolCallId": call_id, "toolName": display, "args": args}
        await checkpoint(run, True, {}, pending=[json.dumps(part)])

    er = next_exec(run, kind)
    exec_msg = exec_message(kind, args, call_id, mcp_name, provider, tool_name)
    exec_msg.id = er.id
    exec_msg.exec_id = er.exec_id
    await link.send(pb.AgentServerMessage(exec_server_message=exec_msg), exec_msg.WhichOneof("args"))
    run.handed_out.append({"call_id": call_id, "name": display, "args": args})
    if run.request.conversation_id:
        run.backend.state.open_tools[run.request.conversation_id] = list(run.handed_out)
    abort_after = spec.get("abort_after")
    step_policy = spec.get("stream_close")
    if step_policy is None and "require_stream_close" in spec:  # the older boolean form
        step_policy = "required" if spec["require_stream_close"] else "accepted"
    results, thrown = await await_exec(run, er, policy_for(run, kind, step_policy),
                                       None if abort_after is None else float(abort_after))

    summary, output = result_summary(kind, results, thrown)
    run.last_tool["result"] = summary
    if output and kind in ("shell", "shell_stream") and spec.get("output_deltas", True):
        delta = pb.ToolCallDelta(shell_tool_call_delta=pb.ShellToolCallDelta(
            stdout=pb.ShellToolCallStdoutDelta(content=output)))
        await link.update("tool_call_delta", call_id=call_id, tool_call_delta=delta, model_call_id=model_call_id)
    completion = spec.get("completion") or {}
    final_args = {k: v for k, v in args.items() if k not in completion.get("omit_keys", [])}
    for k in completion.get("stringify_keys", []):
        if k in final_args and not isinstance(final_args[k], str):
            final_args[k] = json.dumps(final_args[k], ensure_ascii=False)
    completed = tool_call(kind, final_args, call_id, mcp_name, provider, tool_name)
    attach_result(completed, kind, results, thrown)
    await link.update("tool_call_completed", call_id=call_id, tool_call=completed, model_call_id=model_call_id)
    run.turn_steps.append(pb.ConversationStep(tool_call=completed).SerializeToString())
    if spec.get("then") == "reuse":
        await run.reuse()


STEPS: dict[str, Step] = {"tool": tool, "request_context": request_context, "web_search": web_search,
                          "unknown_exec": unknown_exec}
