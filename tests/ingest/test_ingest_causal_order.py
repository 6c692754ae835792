"""Rebuilding the interleaving of a run from its two bodies (``workbench.ingest.causal``)."""

from __future__ import annotations

import pytest

from workbench.decode.classify import Frame
from workbench.ingest.causal import ClientMessage, OrderUnknown, causal_positions, interleave


def f(kind: str, ref: int | None = None) -> Frame:
    return Frame(kind, kind, b"", ref_id=ref)


def merged(server: list[Frame], client: list[ClientMessage], **kw: float) -> list[str]:
    pos = causal_positions(server, client, **kw)
    return [(client[i].frame if side == "client" else server[i]).kind.split(".")[-1] + ("<" if side == "client" else "")
            for side, i in interleave(len(server), pos)]


def c(kind: str, ref: int | None = None, t: float | None = None) -> ClientMessage:
    return ClientMessage(f(kind, ref), t)


def test_answers_right_after_their_requests_and_heartbeats_spread() -> None:
    server = [f("kv_server_message.set_blob_args", 1), f("interaction_update.text_delta"),
              f("exec_server_message.shell_args", 1), f("interaction_update.heartbeat"),
              f("interaction_update.heartbeat"), f("interaction_update.heartbeat"), f("interaction_update.text_delta"),
              f("interaction_update.turn_ended"), f("end_stream")]
    client = [c("run_request"), c("kv_client_message.set_blob_result", 1), c("client_heartbeat"),
              c("exec_client_message.shell_result", 1), c("exec_client_control_message.stream_close", 1),
              c("client_heartbeat"), c("client_heartbeat")]
    assert merged(server, client) == [
        "run_request<", "set_blob_args", "set_blob_result<", "text_delta", "client_heartbeat<", "shell_args",
        "shell_result<", "stream_close<", "heartbeat", "client_heartbeat<", "heartbeat", "heartbeat",
        "client_heartbeat<", "text_delta", "turn_ended", "end_stream"]  # untimed: spread, before the end-stream


def test_times_of_appends_place_what_answers_nothing() -> None:
    server = [f("interaction_update.text_delta")] * 10 + [f("end_stream")]
    # the stream's response ran from t=100 to t=110; a heartbeat append left the client at t=105
    client = [c("bidi_request_id", t=None), c("run_request", t=100.0), c("client_heartbeat", t=105.0)]
    pos = causal_positions(server, client, response_start=100.0, response_end=110.0)
    assert pos == [0, 0, 5]


def test_messages_sent_after_the_response_ended_stay_after_it() -> None:
    server = [f("interaction_update.turn_ended"), f("end_stream")]
    client = [c("run_request", t=1.0), c("client_heartbeat", t=2.0), c("client_heartbeat", t=9.0),
              c("client_heartbeat", t=12.0)]
    pos = causal_positions(server, client, response_start=1.5, response_end=10.0)
    assert pos[-1] == 2 and pos[-2] == 1  # one heartbeat after the end: the client never saw it
    assert merged(server, client, response_start=1.5, response_end=10.0)[-2:] == ["end_stream", "client_heartbeat<"]


def test_ids_that_cannot_be_paired_raise() -> None:
    server = [f("exec_server_message.shell_args", 1)]
    with pytest.raises(OrderUnknown, match="exec 2 which the server never asked"):
        causal_positions(server, [c("run_request"), c("exec_client_message.shell_result", 2)])


def test_client_order_is_kept_even_when_an_older_request_is_answered_late() -> None:
    server = [f("exec_server_message.read_args", 1), f("kv_server_message.set_blob_args", 2)]
    client = [c("run_request"), c("kv_client_message.set_blob_result", 2), c("exec_client_message.read_result", 1)]
    assert merged(server, client) == ["run_request<", "read_args", "set_blob_args", "set_blob_result<", "read_result<"]
