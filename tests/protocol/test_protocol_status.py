"""The session-status rule (``workbench.protocol.status``): each rule, and properties over generated endings."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.protocol.status import (
    CONNECT,
    GRPC,
    GRPC_WEB,
    NO_END,
    NO_RESPONSE,
    ExchangeEnd,
    describe_reset,
    framing_of,
    grpc_fields,
    http_ok,
    reset_facts,
    session_status,
    with_append,
)


def test_framing_follows_the_content_type() -> None:
    assert framing_of("application/connect+proto") == CONNECT
    assert framing_of("application/proto") == CONNECT
    assert framing_of(None) == CONNECT
    assert framing_of("application/grpc") == GRPC
    assert framing_of("Application/GRPC+proto") == GRPC
    assert framing_of("application/grpc-web+proto") == GRPC_WEB
    assert framing_of("application/grpc-web-text") == GRPC_WEB


def test_only_200_is_success() -> None:
    assert http_ok(200)
    for status in (None, 100, 101, 204, 206, 302, 304, 400, 415, 464, 500, 503):
        assert not http_ok(status), status


def test_clean_endings_are_complete() -> None:
    assert session_status(ExchangeEnd("run", 200, end_frame=True)) == ("complete", None)
    assert session_status(ExchangeEnd("unary", 200)) == ("complete", None)
    assert session_status(ExchangeEnd("run", 200, GRPC, grpc_status="0")) == ("complete", None)
    assert session_status(ExchangeEnd("runsse", 200, GRPC_WEB, end_frame=True)) == ("complete", None)


def test_a_connect_stream_needs_its_end_stream_frame() -> None:
    assert session_status(ExchangeEnd("run", 200)) == ("incomplete", NO_END)
    # a grpc-status: 0 trailer is no end for Connect framing (Connect has no trailers)
    assert session_status(ExchangeEnd("run", 200, CONNECT, grpc_status="0")) == ("incomplete", NO_END)


def test_errors_name_what_failed() -> None:
    assert session_status(ExchangeEnd("run", 429, http_error="HTTP 429 resource_exhausted: slow down")) == (
        "error", "HTTP 429 resource_exhausted: slow down")
    assert session_status(ExchangeEnd("run", 302)) == ("error", "HTTP 302")
    assert session_status(ExchangeEnd("run", 200, end_frame=True, end_error="resource_exhausted Error")) == (
        "error", "resource_exhausted Error")
    assert session_status(ExchangeEnd("run", 200, GRPC, grpc_status="8", grpc_message="limit")) == (
        "error", "grpc-status 8 limit")
    assert session_status(ExchangeEnd("unary", 200, GRPC, grpc_status="13")) == ("error", "grpc-status 13")


def test_a_failure_aborts_only_while_the_response_runs() -> None:
    before = reset_facts("client", False, 8)
    after = reset_facts("server", True, 0)
    assert session_status(ExchangeEnd("run", 200, failure="x", reset=before)) == (
        "aborted", "stream reset by client (CANCEL)")
    assert session_status(ExchangeEnd("run", 200, end_frame=True, failure="x", reset=after)) == ("complete", None)
    assert session_status(ExchangeEnd("run", None, failure="peer closed connection")) == (
        "aborted", "peer closed connection")
    lost = reset_facts("client", False, message="Client disconnected.")
    assert describe_reset(lost) == "client connection lost (Client disconnected.)"
    assert "code" not in lost


def test_reset_facts_name_the_code() -> None:
    info = reset_facts("server", False, 2)
    assert info == {"side": "server", "message": "stream reset by server (INTERNAL_ERROR)",
                    "after_response_end": False, "h2_error_code": 2, "code": "INTERNAL_ERROR"}
    assert reset_facts("client", False, 4242)["code"] == "4242"


def test_bodies_a_recording_did_not_keep() -> None:
    assert session_status(ExchangeEnd("run", 200, missing=(("response", "streamed"),))) == (
        "incomplete", "body not recorded (streamed)")
    assert session_status(ExchangeEnd("run", 200, missing=(("request", "streamed"),))) == (
        "incomplete", "request body not recorded (streamed)")
    assert session_status(ExchangeEnd("run", 200, missing=(("request", "not recorded in the HAR"),))) == (
        "incomplete", "request body not recorded in the HAR")
    assert session_status(ExchangeEnd("run", 200, missing=(("response", "mangled in HAR text form"),))) == (
        "error", "response body mangled in HAR text form")


def test_no_response() -> None:
    assert session_status(ExchangeEnd("run")) == ("incomplete", NO_RESPONSE)
    assert session_status(ExchangeEnd("unary")) == ("incomplete", NO_RESPONSE)
    # a recorder that kept the end of the response but not its status still saw a response
    assert session_status(ExchangeEnd("run", None, end_frame=True)) == ("complete", None)


def test_grpc_fields_later_sources_win() -> None:
    assert grpc_fields([("Grpc-Status", "0"), ("x", "y")], {"grpc-status": "8", "grpc-message": "m"}) == {
        "grpc-status": "8", "grpc-message": "m"}
    assert grpc_fields(None, [], {}) == {}


def test_a_refused_append_makes_a_complete_run_error() -> None:
    assert with_append("complete", None, "error", "HTTP 415", "append_seqno 0") == ("error", "append_seqno 0: HTTP 415")
    assert with_append("complete", None, "aborted", "cut", "a") == ("complete", None)
    assert with_append("complete", None, "incomplete", NO_RESPONSE, "a") == ("complete", None)
    assert with_append("aborted", "x", "error", "HTTP 415", "a") == ("aborted", "x")


# properties ------------------------------------------------------------------------------------

STATUSES = st.one_of(st.none(), st.sampled_from([100, 101, 200, 204, 302, 400, 401, 404, 415, 429, 464, 500, 503]))
RESETS = st.one_of(st.none(), st.builds(reset_facts, st.sampled_from(["client", "server"]), st.booleans(),
                                        st.one_of(st.none(), st.integers(0, 13))))


@st.composite
def endings(draw: Any) -> ExchangeEnd:
    end_error = draw(st.one_of(st.none(), st.just("resource_exhausted Error")))
    return ExchangeEnd(
        transport=draw(st.sampled_from(["run", "runsse", "runpoll", "unary", "bidi_append"])),
        http_status=draw(STATUSES), framing=draw(st.sampled_from([CONNECT, GRPC, GRPC_WEB])),
        grpc_status=draw(st.one_of(st.none(), st.sampled_from(["0", "8", "13", "x"]))),
        end_frame=draw(st.booleans()) or end_error is not None, end_error=end_error,
        http_error=draw(st.one_of(st.none(), st.just("HTTP 429 resource_exhausted"))),
        failure=draw(st.one_of(st.none(), st.just("connection lost"))), reset=draw(RESETS),
        missing=tuple(draw(st.lists(st.tuples(st.sampled_from(["response", "request"]),
                                              st.sampled_from(["streamed", "mangled in HAR text form"])),
                                    max_size=1))))


@settings(max_examples=400, deadline=None)
@given(end=endings())
def test_every_ending_has_one_status_and_only_successes_lack_an_error(end: ExchangeEnd) -> None:
    status, error = session_status(end)
    assert status in ("complete", "incomplete", "error", "aborted")
    assert (error is None) == (status == "complete")


@settings(max_examples=400, deadline=None)
@given(end=endings())
def test_the_rules_in_order(end: ExchangeEnd) -> None:
    status, _ = session_status(end)
    if end.failed_before_end:
        assert status == "aborted"
        return
    assert status != "aborted"  # a failure after the response ended leaves what the response earned
    if end.missing:
        assert status in ("incomplete", "error")
        return
    if end.http_status is not None and end.http_status != 200:
        assert status == "error"
    elif end.end_error is not None or end.grpc_status not in (None, "0"):
        assert status == "error"
    elif status == "complete" and end.transport in ("run", "runsse", "runpoll"):
        # a stream is complete only with its end: the end frame, or a clean gRPC trailer for gRPC framing
        assert end.end_frame or (end.grpc_status == "0" and end.framing != CONNECT)


@settings(max_examples=200, deadline=None)
@given(end=endings())
def test_an_end_frame_never_makes_things_worse(end: ExchangeEnd) -> None:
    """Seeing the end of a stream can only move a session towards complete, never away from it."""
    rank = {"complete": 0, "incomplete": 1, "error": 2, "aborted": 3}
    without = ExchangeEnd(end.transport, end.http_status, end.framing, end.grpc_status, end.grpc_message,
                          False, None, end.http_error, end.failure, end.reset, end.missing)
    with_end = ExchangeEnd(end.transport, end.http_status, end.framing, end.grpc_status, end.grpc_message,
                           True, None, end.http_error, end.failure, end.reset, end.missing)
    assert rank[session_status(with_end)[0]] <= rank[session_status(without)[0]]
