"""What a run's opening message says about the run: model, conversation, state, the user's action.

A run starts with ``AgentClientMessage.run_request`` (``AgentRunRequest``), or is warmed up with
``prewarm_request`` (``PrewarmRequest``); both name the model and the conversation. Capture and
imports fill ``sessions.model`` / ``sessions.conversation_id`` from it, analysis checks its
conversation state and reads the prompt, the simulator picks its model the same way.

Model: ``requested_model.model_id`` (newer clients) else ``model_details.model_id`` (field 3).
``conversation_state`` is required on a run request, even empty (two bytes ``0a 00``,
docs/protocol.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from workbench.protocol.kinds import PREWARM_REQUEST, RUN_REQUEST

OPENING_KINDS = (RUN_REQUEST, PREWARM_REQUEST)


@dataclass(frozen=True, slots=True)
class RunRequestFacts:
    """The facts of one run_request / prewarm_request.

    ``has_state``: the conversation_state field is present; ``state_empty``: it is absent or has
    no content. ``action``: the ConversationAction member (``user_message_action``, …; None for a
    prewarm or no action); ``prompt``: the user message's text (or rich text) of a user message action.
    """

    kind: str
    model: str | None
    conversation_id: str | None
    has_state: bool
    state_empty: bool
    action: str | None
    prompt: str


class SessionRow(Protocol):
    """What ``fill_session`` sets (``workbench.store.db.SessionInfo`` is one)."""

    model: str | None
    conversation_id: str | None


def fill_session(info: SessionRow, facts: RunRequestFacts) -> None:
    """A session's model and conversation id from its run's opening message (kept when it names none)."""
    if facts.model:
        info.model = facts.model
    if facts.conversation_id:
        info.conversation_id = facts.conversation_id


def model_of(request: Any) -> str | None:
    """The model a run_request / prewarm_request asks for (None when it names none)."""
    if request.HasField("requested_model") and request.requested_model.model_id:
        return str(request.requested_model.model_id)
    if request.HasField("model_details") and request.model_details.model_id:
        return str(request.model_details.model_id)
    return None


def facts_of(kind: str, request: Any) -> RunRequestFacts:
    """The facts of a parsed ``AgentRunRequest`` / ``PrewarmRequest`` (``kind`` says which)."""
    has_state = request.HasField("conversation_state")
    action = None
    prompt = ""
    if kind == RUN_REQUEST and request.HasField("action"):
        action = request.action.WhichOneof("action")
        if action == "user_message_action":
            um = request.action.user_message_action.user_message
            prompt = um.text or um.rich_text
    return RunRequestFacts(kind, model_of(request), request.conversation_id or None, has_state,
                           not has_state or request.conversation_state.ByteSize() == 0, action, prompt)


def run_request_facts(kind: str, payload: bytes | None, message_class: Any = None) -> RunRequestFacts | None:
    """The facts of an ``AgentClientMessage`` whose member is ``kind`` (run_request or
    prewarm_request); None for another kind or bytes that do not parse. ``message_class``: the
    ``AgentClientMessage`` class of the schema in use (a decoder's), else the overlay's."""
    if kind not in OPENING_KINDS:
        return None
    if message_class is None:
        # protocol/ stays light for the capture addon: the schema (protobuf) loads when a request is parsed
        from workbench.schema import pb

        message_class = pb.AgentClientMessage
    try:
        msg = message_class.FromString(payload or b"")
    except DecodeError:
        return None
    if msg.WhichOneof("message") not in (kind, None):  # another message (an empty one reads as an empty request)
        return None
    return facts_of(kind, getattr(msg, kind))


__all__ = ["OPENING_KINDS", "PREWARM_REQUEST", "RUN_REQUEST", "RunRequestFacts", "SessionRow", "facts_of",
           "fill_session", "model_of", "run_request_facts"]
