"""Session labels: what makes a session recognisable in a list (``sessions.label``).

A session's label is, first match wins:

1. the scenario it was made from, when its maker knows it (the demo, the demo suite, fixtures);
2. the simulator scenario named by a ``[scenario:NAME]`` marker in the first user prompt (captures
   and recordings of simulator traffic);
3. an excerpt of the first user prompt: one line, at most ``LABEL_MAX`` characters.

A prompt hidden by ``--redact content`` gives no label (its text is a redaction marker), so a label
never carries content the recording itself does not. Each writer calls ``fill_label`` once per
source of prompts (the capture writer, imports, the client's recording); makers that know the
scenario call ``set_label``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.store.db import SessionInfo, Store

LABEL_MAX = 60
# The prompt marker that selects a simulator scenario (``workbench sim``): ``[scenario:NAME]``.
# Defined here, below the simulator, because labels read it in any recording of sim traffic.
SCENARIO_MARKER = re.compile(r"\[scenario:([A-Za-z0-9_.\-]+)\]")
# Client messages whose user text is a prompt: the run's first request, or a follow-up turn.
PROMPT_KINDS = ("run_request", "conversation_action.user_message_action", "conversation_action")
_REDACTED = re.compile(r"^\[redacted sha256:[0-9a-f]+\]$")
_SPACE = re.compile(r"\s+")


def scenario_in(text: str | None) -> str | None:
    """The simulator scenario a ``[scenario:NAME]`` prompt marker selects."""
    m = SCENARIO_MARKER.search(text or "")
    return m.group(1) if m else None


def is_redacted(text: str) -> bool:
    return bool(_REDACTED.match(text.strip()))


def prompt_label(text: str | None) -> str | None:
    """The label a first user prompt gives: its scenario marker, else a one-line excerpt; None when
    the prompt is empty or redacted."""
    if not text or not text.strip() or is_redacted(text):
        return None
    scenario = scenario_in(text)
    if scenario:
        return scenario
    line = _SPACE.sub(" ", text).strip()
    return line if len(line) <= LABEL_MAX else line[: LABEL_MAX - 1].rstrip() + "…"


def prompt_of(kind: str, payload: bytes | None) -> str | None:
    """The user text carried by a client frame of one of ``PROMPT_KINDS`` (an AgentClientMessage)."""
    if not payload or not kind.startswith(PROMPT_KINDS):
        return None
    # protocol/ stays light for the capture addon and `workbench sessions`: protobuf and the schema
    # load when a prompt is read
    from google.protobuf.message import DecodeError

    from workbench.schema import pb  # the compiled schema: loaded when a prompt is read, as protobuf

    try:
        msg: Any = pb.AgentClientMessage.FromString(payload)
    except DecodeError:
        return None
    if kind == "run_request":
        if not msg.run_request.HasField("action"):
            return None
        action = msg.run_request.action
    else:
        action = msg.conversation_action
    if not action.HasField("user_message_action"):
        return None
    um = action.user_message_action.user_message
    return str(um.text or um.rich_text or "") or None


def fill_label(info: SessionInfo, *, kind: str | None = None, payload: bytes | None = None,
               prompt: str | None = None) -> bool:
    """Give an unlabelled session the label of its first prompt: from a client frame (``kind`` and
    ``payload``, as stored, i.e. already redacted) or from prompt text. True when it set one."""
    if info.label:
        return False
    text = prompt if prompt is not None else prompt_of(kind or "", payload)
    label = prompt_label(text)
    if label is None:
        return False
    info.label = label
    return True


def set_label(info: SessionInfo, label: str | None) -> None:
    """The label a session's maker knows (a scenario name): it wins over a prompt's."""
    if label:
        info.label = label[:LABEL_MAX]


def store_labels(store: Store, labels: Mapping[str, str]) -> int:
    """Set known labels on stored sessions (session id → label); returns how many were found."""
    infos = []
    for sid, label in labels.items():
        info = store.session(sid)
        if info is not None:
            set_label(info, label)
            infos.append(info)
    if infos:
        store.upsert_sessions(infos)
    return len(infos)
