"""A real ``workbench sim`` subprocess for the client's end-to-end tests, and readers for what the
client recorded. The sim prints its URL, then ``cert: PATH``; each finished run is one summary line
on stderr (``run N <transport> scenario=… -> <outcome> (…) [faults: …]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support import WORKBENCH, SimProcess, start_sim

from workbench.store.reader import open_reader

__all__ = ["WORKBENCH", "SimProcess", "exec_answers", "exec_kinds", "recorded_frames", "start_sim"]


def recorded_frames(db: Path, session_id: str | None = None) -> list[dict[str, Any]]:
    """The recorded frames (seq order) of one session, or of the only/last one."""
    reader = open_reader(db)
    try:
        if session_id is None:
            rows = reader.query("SELECT session_id FROM sessions ORDER BY started_at").to_pylist()
            session_id = rows[-1]["session_id"]
        return reader.query("SELECT seq, direction, transport, kind, ref_id, payload FROM frames "
                            "WHERE session_id = ? ORDER BY seq", [session_id]).to_pylist()
    finally:
        reader.close()


def exec_answers(frames: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Per exec id the server asked for: the client's frames for it, in order, as short names
    ('read_result', 'stream_close', 'throw', 'shell_stream_result.exit', …)."""
    from workbench.schema import pb

    asked = [f["ref_id"] for f in frames if f["direction"] == "server" and f["kind"].startswith("exec_server_message.")]
    out: dict[int, list[str]] = {eid: [] for eid in asked}
    for f in frames:
        if f["direction"] != "client" or f["ref_id"] not in out:
            continue
        kind = f["kind"]
        if kind.startswith("exec_client_message."):
            member = kind.split(".", 1)[1]
            if member == "shell_stream_result":
                msg = pb.message("AgentClientMessage").FromString(f["payload"])
                member += "." + str(msg.exec_client_message.shell_stream_result.WhichOneof("event"))
            out[f["ref_id"]].append(member)
        elif kind.startswith("exec_client_control_message."):
            member = kind.split(".", 1)[1]
            if member != "heartbeat":
                out[f["ref_id"]].append(member)
    return out


def exec_kinds(frames: list[dict[str, Any]]) -> dict[int, str]:
    """exec id → the args member the server sent ('read_args', …)."""
    return {f["ref_id"]: f["kind"].split(".", 1)[1] for f in frames
            if f["direction"] == "server" and f["kind"].startswith("exec_server_message.")}
