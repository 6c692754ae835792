"""Side panels of the session screen: findings, tool calls, KV blobs (one table each)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from rich.text import Text
from textual.widgets import DataTable

from workbench.analysis.model import Finding
from workbench.store.view_reads import BlobView, ToolCallView
from workbench.textsafe import rich_text

_Record = TypeVar("_Record")

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", "note": "cyan"}


def _seqs(first: int | None, last: int | None) -> str:
    if first is None:
        return ""
    return str(first) if last is None or last == first else f"{first}…{last}"


FINDING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("lit", " "), ("severity", "severity"), ("code", "code"), ("frames", "frames"), ("message", "message"))
# A pane too narrow to give the message this much in its own column shows each finding on two
# lines instead: severity, code and frames, then the message under them.
MIN_MESSAGE = 30
NARROW_COLUMNS: tuple[tuple[str, str], ...] = (("lit", " "), ("finding", "finding"))


def finding_code(f: Finding) -> str:
    """The code, marked ``↳`` when another finding of the session explains it (``order_findings``)."""
    return f"↳ {f.code}" if f.cause else f.code


class FindingsTable(DataTable[Any]):
    """Findings of the session, root cause first (each follower after the finding that explains
    it); in replay, the ones whose evidence was reached light up. The message column takes what
    the pane has left, so it stays readable on a 120-column terminal."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.findings: list[Finding] = []
        self.lit: set[int] | None = None   # None = not replaying: all shown plainly
        self._widths: dict[str, int] = {}

    def on_mount(self) -> None:
        self._layout()

    def on_resize(self) -> None:
        if self._layout():
            self._rows()

    @property
    def narrow(self) -> bool:
        return "finding" in self._widths

    def _layout(self) -> bool:
        """Fit the columns to the pane; True when they changed (and the rows need adding again)."""
        codes = [len(finding_code(f)) for f in self.findings]
        frames = [len(_seqs(f.first_seq, f.last_seq)) for f in self.findings]
        widths = {"lit": 1, "severity": 8, "code": min(30, max([4, *codes])), "frames": max([6, *frames])}
        width = (self.size.width or 80) - 2  # the scrollbar
        room = width - 2 * len(FINDING_COLUMNS) - sum(widths.values())  # cells are padded by 2
        if room >= MIN_MESSAGE:
            widths["message"] = room
            columns = FINDING_COLUMNS
        else:
            widths = {"lit": 1, "finding": max(MIN_MESSAGE, width - 4 - 1)}
            columns = NARROW_COLUMNS
        if widths == self._widths and self.columns:
            return False
        self._widths = widths
        self.clear(columns=True)
        for key, header in columns:
            self.add_column(header, key=key, width=widths[key])
        return True

    def set_findings(self, findings: list[Finding]) -> None:
        if findings == self.findings:
            return
        self.findings = findings
        self._layout()
        self._rows()

    def _rows(self) -> None:
        keep = self.cursor_row
        self.clear()
        height = 2 if self.narrow else 1
        for i, f in enumerate(self.findings):
            self.add_row(*self._cells(i, f).values(), key=str(i), height=height)
        if self.findings:
            self.move_cursor(row=min(max(keep, 0), len(self.findings) - 1))

    def _cells(self, i: int, f: Finding) -> dict[str, Text]:
        sev = f.severity
        lit = self.lit is None or i in self.lit
        dim = "" if lit else "dim"
        mark = Text("●", SEVERITY_STYLE.get(sev, "")) if self.lit is not None and lit else Text(
            "○" if self.lit is not None else " ", "dim")
        sev_text = Text(sev, SEVERITY_STYLE.get(sev, "") if lit else "dim")
        if self.narrow:
            width = self._widths["finding"]
            line = Text.assemble(sev_text, "  ", (finding_code(f), dim), "  ",
                                 (_seqs(f.first_seq, f.last_seq), "dim"))
            message = rich_text(f.message, dim, display=True)
            line.truncate(width, overflow="ellipsis")
            message.truncate(width, overflow="ellipsis")
            return {"lit": mark, "finding": Text("\n").join([line, message])}
        cells = {"lit": mark, "severity": sev_text,
                 "code": Text(finding_code(f), dim, no_wrap=True, overflow="ellipsis"),
                 "frames": Text(_seqs(f.first_seq, f.last_seq), dim),
                 "message": rich_text(f.message, dim, display=True, no_wrap=True, overflow="ellipsis")}
        return cells

    def set_lit(self, lit: set[int] | None) -> None:
        if lit == self.lit:
            return
        self.lit = lit
        for i, f in enumerate(self.findings):
            for col, cell in self._cells(i, f).items():
                self.update_cell(str(i), col, cell)

    def lit_by(self, seq: int) -> set[int]:
        """Indices of findings whose first evidence frame is at or before ``seq``."""
        return {i for i, f in enumerate(self.findings) if f.evidence and f.evidence[0] <= seq}

    def selected(self) -> Finding | None:
        if not self.findings or self.cursor_row < 0:
            return None
        return self.findings[min(self.cursor_row, len(self.findings) - 1)]


def set_measured_rows(table: DataTable[Any], columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Replace the table's rows, each column as wide as its widest cell. DataTable measures
    auto-width columns only when it next goes idle, so a picture taken before that (a snapshot on a
    busy machine) showed the headers' widths; measured here, the widths come with the rows. Cells
    are plain text (a preview holding ``[b]`` is not markup)."""
    cells = [tuple(c if isinstance(c, Text) else rich_text(c) for c in row) for row in rows]
    widths = [max([len(col), *(row[i].cell_len for row in cells)]) for i, col in enumerate(columns)]
    table.clear(columns=True)
    for col, width in zip(columns, widths, strict=True):
        table.add_column(col, key=col, width=width)
    for i, row in enumerate(cells):
        table.add_row(*row, key=str(i))


class RecordsTable(DataTable[Any], Generic[_Record]):
    """A table of records, one row each (``cells`` says which), columns as wide as their widest cell."""

    COLUMNS: tuple[str, ...] = ()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.records: list[_Record] = []

    def on_mount(self) -> None:
        set_measured_rows(self, self.COLUMNS, [])

    def set_records(self, records: list[_Record]) -> None:
        if records == self.records:
            return
        self.records = records
        set_measured_rows(self, self.COLUMNS, [self.cells(r) for r in records])

    def cells(self, record: _Record) -> tuple[Any, ...]:
        raise NotImplementedError

    def selected(self) -> _Record | None:
        if not self.records or self.cursor_row < 0:
            return None
        return self.records[min(self.cursor_row, len(self.records) - 1)]


class ToolCallsTable(RecordsTable[ToolCallView]):
    COLUMNS = ("call_id", "tool", "status", "exec", "frames")

    def cells(self, c: ToolCallView) -> tuple[Any, ...]:
        status_style = "green" if c["status"] in ("ok", "complete", "completed") else "yellow"
        return (c["call_id"], c["tool_name"], rich_text(c["status"], status_style),
                "" if c["exec_id"] is None else str(c["exec_id"]), _seqs(c["first_seq"], c["last_seq"]))


class BlobsTable(RecordsTable[BlobView]):
    COLUMNS = ("op", "role", "type", "size", "sha256", "status", "seq", "preview")

    def cells(self, b: BlobView) -> tuple[Any, ...]:
        ok = b["sha256_ok"]
        sha = Text("✓", "green") if ok else Text("✗", "red") if ok is False else Text("?", "dim")
        status_style = "red" if b["status"] in ("miss", "never_set", "unanswered") else ""
        return (b["op"], b["role"], b["content_type"], "" if b["size"] is None else str(b["size"]), sha,
                rich_text(b["status"], status_style), "" if b["seq"] is None else str(b["seq"]),
                b["preview"][:50])  # one line: a newline shows as \n (workbench.textsafe)
