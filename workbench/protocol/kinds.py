"""Frame kinds: the names the decoder gives frames, and the questions asked of them.

A frame's ``kind`` is ``<member>`` or ``<member>.<sub-member>`` of the message it carries
(``interaction_update.heartbeat``, ``exec_server_message.shell_stream_args``), or a name of the
transport (``end_stream``, ``end_stream.error``, ``http_error``, ``malformed``, …); see
``workbench.decode.classify``, which makes them, and docs/protocol.md. The strings are stored in the
database and shown to users, so they never change; code that tests a kind uses the constants and
predicates here instead of typing the string, so each rule ("which kinds are heartbeats", "is this
the end of the stream") is written once.

SQL that filters by kind takes these constants as bound parameters or through ``sql_list``.
"""

from __future__ import annotations

from collections.abc import Iterable

# --- the run and its turns -------------------------------------------------------------------
RUN_REQUEST = "run_request"
PREWARM_REQUEST = "prewarm_request"
FOLLOWUP_ACTION = "conversation_action.user_message_action"

# --- families: the top-level member of a message (``family.member`` kinds) -------------------------
INTERACTION_UPDATE = "interaction_update"
EXEC_SERVER = "exec_server_message"
EXEC_CLIENT = "exec_client_message"
EXEC_CLIENT_CONTROL = "exec_client_control_message"
EXEC_SERVER_CONTROL = "exec_server_control_message"
KV_SERVER = "kv_server_message"
KV_CLIENT = "kv_client_message"
INTERACTION_QUERY = "interaction_query"
INTERACTION_RESPONSE = "interaction_response"
CONVERSATION_ACTION = "conversation_action"

# --- interaction updates (server) ------------------------------------------------------------
TURN_ENDED = "interaction_update.turn_ended"
TEXT_DELTA = "interaction_update.text_delta"
TOKEN_DELTA = "interaction_update.token_delta"
THINKING_DELTA = "interaction_update.thinking_delta"
THINKING_COMPLETED = "interaction_update.thinking_completed"
STEP_STARTED = "interaction_update.step_started"
STEP_COMPLETED = "interaction_update.step_completed"
PARTIAL_TOOL_CALL = "interaction_update.partial_tool_call"
TOOL_CALL_STARTED = "interaction_update.tool_call_started"
TOOL_CALL_COMPLETED = "interaction_update.tool_call_completed"
TOOL_CALL_DELTA = "interaction_update.tool_call_delta"
SUMMARY = "interaction_update.summary"
SUMMARY_STARTED = "interaction_update.summary_started"
SUMMARY_COMPLETED = "interaction_update.summary_completed"
USER_MESSAGE_APPENDED = "interaction_update.user_message_appended"
SHELL_OUTPUT_DELTA = "interaction_update.shell_output_delta"
CHECKPOINT = "conversation_checkpoint_update"

# --- heartbeats: timing only, either side; they answer nothing and nothing answers them ---------
SERVER_HEARTBEAT = "interaction_update.heartbeat"
CLIENT_HEARTBEAT = "client_heartbeat"
EXEC_HEARTBEAT = "exec_client_control_message.heartbeat"  # the client: a local exec still runs
HEARTBEAT = SERVER_HEARTBEAT
HEARTBEATS = (SERVER_HEARTBEAT, CLIENT_HEARTBEAT, EXEC_HEARTBEAT)
# the client's heartbeats: timing-dependent, so replay and comparisons ignore them
CLIENT_HEARTBEATS = frozenset({CLIENT_HEARTBEAT, EXEC_HEARTBEAT})

# --- exec and kv requests and answers --------------------------------------------------------
SHELL_STREAM_ARGS = "exec_server_message.shell_stream_args"
EXEC_THROW = "exec_client_control_message.throw"
EXEC_STREAM_CLOSE = "exec_client_control_message.stream_close"
EXEC_ABORT = "exec_server_control_message.abort"
KV_GET_BLOB_ARGS = "kv_server_message.get_blob_args"
KV_SET_BLOB_ARGS = "kv_server_message.set_blob_args"
KV_GET_BLOB_RESULT = "kv_client_message.get_blob_result"

# --- transport: how a stream or a call ended, and frames that are no message ------------------
END_STREAM = "end_stream"  # a clean end (Connect 0x02 ``{}``, gRPC-Web trailer grpc-status 0)
END_STREAM_ERROR = "end_stream.error"  # an end carrying an error
HTTP_ERROR = "http_error"  # the body of a non-200 answer
MALFORMED = "malformed"
EMPTY = "empty"

# --- the OpenAI side of a bridge (``workbench.decode.openai``): one frame per request body, per SSE
# event, per whole answer. The payload is the JSON the event carried, as it crossed the wire.
OPENAI = "openai"
OPENAI_REQUEST = "openai.request"                    # a request body (chat, responses, models)
OPENAI_CONTENT = "openai.delta.content"              # answer text (chat delta.content, output_text.delta)
OPENAI_TOOL_CALLS = "openai.delta.tool_calls"        # tool-call name/arguments (delta or function_call event)
OPENAI_REASONING = "openai.delta.reasoning"          # reasoning text
OPENAI_ROLE = "openai.delta.role"                    # a chunk that only names the role
OPENAI_FINISH = "openai.finish"                      # finish_reason / response.completed|incomplete
OPENAI_USAGE = "openai.usage"                        # a usage-only chunk
OPENAI_ERROR = "openai.error"                        # an error object (event or whole body)
OPENAI_DONE = "openai.done"                          # ``data: [DONE]``
OPENAI_COMMENT = "openai.comment"                    # an SSE comment (``: ping``): keeps the line open, carries nothing
OPENAI_EVENT = "openai.event"                        # any other Responses event (created, output_item.added, …)
OPENAI_RESPONSE = "openai.response"                  # a whole (not streamed) answer
OPENAI_MODELS = "openai.models"                      # a /v1/models answer
# kinds that bring the client something of the answer (what "first token" means on the OpenAI side)
OPENAI_ANSWER = (OPENAI_CONTENT, OPENAI_TOOL_CALLS, OPENAI_REASONING, OPENAI_RESPONSE)


def family(kind: str) -> str:
    """The top-level member of a kind: ``exec_server_message`` for
    ``exec_server_message.shell_stream_args``; the kind itself when it has no member."""
    return kind.split(".", 1)[0]


def in_family(kind: str, *families: str) -> bool:
    """Is ``kind`` one of ``families`` or a member of one (``in_family(k, KV_SERVER)``)?"""
    return family(kind) in families


def member(kind: str) -> str:
    """The sub-member of a kind (``heartbeat`` of ``interaction_update.heartbeat``); "" for none."""
    return kind.split(".", 1)[1] if "." in kind else ""


def is_end_stream(kind: str) -> bool:
    """The frame that ends a stream, clean or with an error (``end_stream``, ``end_stream.error``).
    SQL asks the same with ``starts_with(kind, END_STREAM)``."""
    return kind.startswith(END_STREAM)


def is_end_stream_error(kind: str) -> bool:
    """The end of a stream carrying an error."""
    return kind == END_STREAM_ERROR


def is_heartbeat(kind: str) -> bool:
    """Timing-only messages (either side): they answer nothing and nothing answers them."""
    return kind in HEARTBEATS


def is_server_heartbeat(kind: str) -> bool:
    return kind == SERVER_HEARTBEAT


def is_client_heartbeat(kind: str) -> bool:
    """A client keep-alive: the run's ``client_heartbeat`` or an exec's heartbeat."""
    return kind in CLIENT_HEARTBEATS


def is_openai(kind: str) -> bool:
    """A frame of the OpenAI side of a bridge (``openai.*``)."""
    return kind.startswith("openai.")


def sql_list(kinds: Iterable[str]) -> str:
    """``('a', 'b')`` for ``kind IN …`` in SQL text. Kinds are the constants above (lower-case names
    and dots only), so quoting is safe; a value from outside never goes through here."""
    items = list(kinds)
    for k in items:
        if not k.replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"not a frame kind: {k!r}")
    return "(" + ", ".join(f"'{k}'" for k in items) + ")"
