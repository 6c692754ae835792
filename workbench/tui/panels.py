"""Side panels of the session screen: findings, tool calls, KV blobs (one table each)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _seqs(first: Any, last: Any) -> str:
    if first is None:
        return ""
    return str(first) if last is None or last == first else f"{first}…{last}"


class FindingsTable(DataTable[Any]):
    """Findings of the session; in replay, the ones whose evidence was reached light up."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.findings: list[dict[str, Any]] = []
        self.lit: set[int] | None = None   # None = not replaying: all shown plainly

    def on_mount(self) -> None:
        self.add_column(" ", key="lit", width=1)
        self.add_column("severity", key="severity")
        self.add_column("code", key="code")
        self.add_column("frames", key="frames")
        self.add_column("message", key="message")

    def set_findings(self, findings: list[dict[str, Any]]) -> None:
        if findings == self.findings:
            return
        keep = self.cursor_row
        self.findings = findings
        self.clear()
        for i, f in enumerate(findings):
            self.add_row(*self._cells(i, f), key=str(i))
        if findings:
            self.move_cursor(row=min(keep, len(findings) - 1))

    def _cells(self, i: int, f: dict[str, Any]) -> list[Any]:
        sev = f["severity"]
        lit = self.lit is None or i in self.lit
        dim = "" if lit else "dim"
        mark = Text("●", SEVERITY_STYLE.get(sev, "")) if self.lit is not None and lit else Text(
            "○" if self.lit is not None else " ", "dim")
        return [mark, Text(sev, SEVERITY_STYLE.get(sev, "") if lit else "dim"), Text(f["code"], dim),
                Text(_seqs(f["first_seq"], f["last_seq"]), dim), Text(f["message"], dim)]

    def set_lit(self, lit: set[int] | None) -> None:
        if lit == self.lit:
            return
        self.lit = lit
        for i, f in enumerate(self.findings):
            for col, cell in zip(("lit", "severity", "code", "frames", "message"), self._cells(i, f), strict=True):
                self.update_cell(str(i), col, cell)

    def lit_by(self, seq: int) -> set[int]:
        """Indices of findings whose first evidence frame is at or before ``seq``."""
        return {i for i, f in enumerate(self.findings) if f["evidence"] and min(f["evidence"]) <= seq}

    def selected(self) -> dict[str, Any] | None:
        if not self.findings or self.cursor_row < 0:
            return None
        return self.findings[min(self.cursor_row, len(self.findings) - 1)]


class ToolCallsTable(DataTable[Any]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.calls: list[dict[str, Any]] = []

    def on_mount(self) -> None:
        for col in ("call_id", "tool", "status", "exec", "frames"):
            self.add_column(col, key=col)

    def set_calls(self, calls: list[dict[str, Any]]) -> None:
        if calls == self.calls:
            return
        self.calls = calls
        self.clear()
        for i, c in enumerate(calls):
            status_style = "green" if c["status"] in ("ok", "complete", "completed") else "yellow"
            self.add_row(c["call_id"], c["tool_name"], Text(c["status"], status_style),
                         "" if c["exec_id"] is None else str(c["exec_id"]),
                         _seqs(c["first_seq"], c["last_seq"]), key=str(i))

    def selected(self) -> dict[str, Any] | None:
        if not self.calls or self.cursor_row < 0:
            return None
        return self.calls[min(self.cursor_row, len(self.calls) - 1)]


class BlobsTable(DataTable[Any]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.blobs: list[dict[str, Any]] = []

    def on_mount(self) -> None:
        for col in ("op", "role", "type", "size", "sha256", "status", "seq", "preview"):
            self.add_column(col, key=col)

    def set_blobs(self, blobs: list[dict[str, Any]]) -> None:
        if blobs == self.blobs:
            return
        self.blobs = blobs
        self.clear()
        for i, b in enumerate(blobs):
            ok = b["sha256_ok"]
            sha = Text("✓", "green") if ok else Text("✗", "red") if ok is False else Text("?", "dim")
            status_style = "red" if b["status"] in ("miss", "never_set", "unanswered") else ""
            self.add_row(b["op"], b["role"], b["content_type"], "" if b["size"] is None else str(b["size"]), sha,
                         Text(b["status"], status_style), "" if b["seq"] is None else str(b["seq"]),
                         b["preview"][:50].replace("\n", " "), key=str(i))

    def selected(self) -> dict[str, Any] | None:
        if not self.blobs or self.cursor_row < 0:
            return None
        return self.blobs[min(self.cursor_row, len(self.blobs) - 1)]
