"""The frame detail pane: named tree, JSON and hex dump tabs."""

from __future__ import annotations

from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static, TabbedContent, TabPane, Tree
from textual.widgets.tree import TreeNode

from workbench.store.gate import wire_str
from workbench.textsafe import escape, escape_display, escape_json
from workbench.tui.data import FrameDetail
from workbench.tui.timeline import arrow, kind_style
from workbench.wire.envelope import FLAG_COMPRESSED, flag_names

HEX_LIMIT = 64 * 1024
JSON_LIMIT = 200_000
TREE_CHILD_LIMIT = 500
TREE_NODE_BUDGET = 5000
TREE_OPEN_DEPTH = 8
_HEADER_STYLE = "bold black on yellow"


def hex_dump(header: bytes, body: bytes, limit: int = HEX_LIMIT, per_line: int = 16, *,
             enveloped: bool | None = None, flags: int = 0) -> Text:
    """Offset, 16 bytes in hex, ASCII; the envelope header bytes are highlighted. The header's
    length is the payload's length on the wire: a gzip frame's body is shown inflated below it."""
    data = header + body[:limit]
    n_head = len(header)
    out = Text()
    if header:
        flags = header[0]
        length = int.from_bytes(header[1:5], "big")
        out.append("envelope header ", _HEADER_STYLE)
        out.append(f"  flags 0x{flags:02x} ({', '.join(flag_names(flags))}) | length {length}")
        if flags & FLAG_COMPRESSED and length != len(body):
            out.append(f" on the wire; payload shown inflated ({len(body)} bytes)")
        out.append("\n\n")
    elif enveloped:
        out.append(f"envelope flags 0x{flags:02x} ({', '.join(flag_names(flags))}); length on the wire not "
                   f"recorded; payload shown inflated ({len(body)} bytes)\n\n", "dim")
    else:
        out.append("not enveloped on this transport (payload bytes only)\n\n", "dim")
    for off in range(0, len(data), per_line):
        chunk = data[off:off + per_line]
        out.append(f"{off:08x}  ", "dim")
        for i in range(per_line):
            pos = off + i
            if i < len(chunk):
                out.append(f"{chunk[i]:02x}", _HEADER_STYLE if pos < n_head else "")
            else:
                out.append("  ")
            out.append(" " if i != 7 or per_line <= 8 else "  ")
        out.append(" │", "dim")
        for i, b in enumerate(chunk):
            ch = chr(b) if 0x20 <= b < 0x7F else "."
            out.append(ch, _HEADER_STYLE if off + i < n_head else "cyan")
        out.append("│\n", "dim")
    if len(body) > limit:
        out.append(f"… {len(body) - limit} more bytes\n", "dim")
    return out


def _label(key: str, value: Any) -> Text:
    t = Text(escape(key), "bold")  # field names and values are the capture's: escaped (workbench.textsafe)
    if isinstance(value, dict):
        t.append(f"  {{{len(value)}}}", "dim")
    elif isinstance(value, list):
        t.append(f"  [{len(value)}]", "dim")
    else:
        s = escape_display(repr(value)) if not isinstance(value, str) else f'"{escape(value)}"'
        if len(s) > 200:
            s = s[:200] + "…"
        t.append(": ")
        t.append(s, "green" if isinstance(value, str) else "cyan")
    return t


def fill_tree(node: TreeNode[Any], value: Any, budget: list[int] | None = None, depth: int = 0) -> None:
    """Add ``value`` under ``node``; at most TREE_NODE_BUDGET nodes, deep levels start collapsed."""
    budget = budget if budget is not None else [TREE_NODE_BUDGET]
    items: list[tuple[str, Any]]
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(f"[{i}]", v) for i, v in enumerate(value)]
    else:
        node.add_leaf(_label("value", value))
        return
    for key, v in items[:TREE_CHILD_LIMIT]:
        if budget[0] <= 0:
            node.add_leaf(Text("… more fields (see the JSON tab)", "dim"))
            return
        budget[0] -= 1
        if isinstance(v, dict | list) and v:
            child = node.add(_label(key, v), expand=depth < TREE_OPEN_DEPTH)
            fill_tree(child, v, budget, depth + 1)
        else:
            node.add_leaf(_label(key, v))
    if len(items) > TREE_CHILD_LIMIT:
        node.add_leaf(Text(f"… {len(items) - TREE_CHILD_LIMIT} more", "dim"))


class FrameDetailView(Vertical):
    """Tabs for the frame under the timeline cursor."""

    DEFAULT_CSS = """
    FrameDetailView #detail-head { height: auto; padding: 0 1; background: $boost; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.detail: FrameDetail | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="detail-head")
        with TabbedContent(id="detail-tabs"):  # the first pane (see SessionSide.build)
            with TabPane("Tree", id="tab-tree"):
                tree: Tree[Any] = Tree("frame", id="detail-tree")
                tree.show_root = False
                yield tree
            with TabPane("JSON", id="tab-json"), VerticalScroll(id="json-scroll"):
                yield Static("", id="detail-json")
            with TabPane("Hex", id="tab-hex"), VerticalScroll(id="hex-scroll"):
                yield Static("", id="detail-hex")

    @property
    def active(self) -> str:
        return self.query_one("#detail-tabs", TabbedContent).active

    @active.setter
    def active(self, tab: str) -> None:
        self.query_one("#detail-tabs", TabbedContent).active = tab

    def show(self, detail: FrameDetail | None) -> None:
        self.detail = detail
        head = self.query_one("#detail-head", Static)
        tree = self.query_one("#detail-tree", Tree)
        tree.clear()
        if detail is None:
            head.update("no frame")
            self.query_one("#detail-json", Static).update("")
            self.query_one("#detail-hex", Static).update("")
            return
        h = Text()
        h.append(f"#{detail.seq} ", "bold")
        h.append(arrow(detail.direction) + " ")
        h.append(escape(detail.kind), kind_style(detail.kind))
        h.append(f"  {detail.size} B  {escape(detail.msg_type)}\n", "dim")
        h.append(escape_display(wire_str(detail.summary)))  # the text the stored form stands for
        if detail.error:
            h.append(f"\n⚠ {escape_display(wire_str(detail.error))}", "bold red")
        head.update(h)
        fill_tree(tree.root, detail.tree)
        tree.root.expand()
        text = escape_json(detail.as_json())  # the same JSON, no raw control character (workbench.textsafe)
        if len(text) > JSON_LIMIT:   # highlighting megabytes of JSON would stall the UI thread
            text = text[:JSON_LIMIT] + f"\n… {len(text) - JSON_LIMIT} more characters (see workbench frames --json)"
        self.query_one("#detail-json", Static).update(
            Syntax(text, "json", theme="ansi_dark", word_wrap=True, background_color="default"))
        # 16 bytes a line need 78 columns; narrower panes get 8
        per_line = 16 if self.size.width >= 80 or not self.size.width else 8
        hx = hex_dump(detail.header, detail.payload, per_line=per_line, enveloped=detail.enveloped,
                      flags=detail.flags)
        if detail.raw is not None and detail.raw != detail.payload:
            hx.append("\nwrapper bytes as sent (BidiAppend / BidiPoll):\n", "bold")
            hx.append_text(hex_dump(b"", detail.raw, per_line=per_line))
        self.query_one("#detail-hex", Static).update(hx)
