"""Pop-up screens: a tool call's arguments side by side, one KV blob, and help."""

from __future__ import annotations

from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from workbench.store.view_reads import BlobView, ToolCallView
from workbench.textsafe import escape, escape_display, escape_json, rich_text
from workbench.tui.data import pretty_blob, pretty_json, sha256_check


def _json(text: str) -> Syntax:
    # the same JSON with no raw control character in its strings (workbench.textsafe)
    return Syntax(escape_json(text), "json", theme="ansi_dark", word_wrap=True, background_color="default")


class ToolCallScreen(ModalScreen[None]):
    """args as streamed, as in tool_call_completed, merged, and naively concatenated."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, call: ToolCallView) -> None:
        super().__init__(classes="wb-modal")
        self.call = call

    def compose(self) -> ComposeResult:
        c = self.call
        with Vertical(classes="wb-modal-box"):
            head = Text()
            head.append(f"tool call {escape(c['call_id'])}", "bold")
            head.append(f"  {escape(c['tool_name'])}  status {escape(c['status'])}  exec {escape(c['exec_id'])}  "
                        f"frames {c['first_seq']}…{c['last_seq']}", "dim")
            yield Static(head, classes="wb-modal-title")
            with Horizontal(id="args-columns"):
                for title, key in (("streamed", "args_streamed"), ("completion", "args_completion"),
                                   ("merged", "args_merged"), ("naive concatenation", "args_naive")):
                    with VerticalScroll(classes="args-col", id=f"col-{key}"):
                        yield Static(Text(title, "bold underline"))
                        value = c.get(key)
                        yield Static(_json(pretty_json(value)) if value is not None else Text("—", "dim"))
            if c.get("result") is not None:
                with VerticalScroll(id="call-result"):
                    yield Static(Text("result", "bold underline"))
                    yield Static(_json(pretty_json(c["result"])))
            yield Static(Text("esc to close", "dim"))


class BlobScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, blob: BlobView, data: bytes | None) -> None:
        super().__init__(classes="wb-modal")
        self.blob = blob
        self.data = data

    def compose(self) -> ComposeResult:
        b = self.blob
        ok, digest = sha256_check(b["blob_id"], self.data)
        facts = Table.grid(padding=(0, 2))
        facts.add_column(style="bold")
        facts.add_column()
        # Every cell a Text: a Table reads plain strings as markup, and role, type and id come from
        # the capture (a crafted one could otherwise put a clickable action on screen).
        # (and escaped: workbench.textsafe)
        facts.add_row("blob id", rich_text(b["blob_id"]))
        facts.add_row("op / status", Text(f"{escape(b['op'])} / {escape(b['status'])}"))
        facts.add_row("role / type", Text(f"{escape(b['role']) or '—'} / {escape(b['content_type']) or '—'}"
                                          + (f" ({escape(b['proto_type'])})" if b.get("proto_type") else "")))
        facts.add_row("size", Text(f"{b['size']} bytes"))
        facts.add_row("frames", Text(f"request {b['seq']}, answer {b['result_seq']}"))
        if ok is None:
            check = Text("no bytes captured: cannot check", "dim")
        elif ok:
            check = Text("✓ id = SHA-256(data)", "green")
        else:
            check = Text(f"✗ SHA-256(data) = {digest}", "red")
        facts.add_row("SHA-256", check)
        with Vertical(classes="wb-modal-box"):
            yield Static(Text("KV blob", "bold"), classes="wb-modal-title")
            yield Static(facts)
            with VerticalScroll(id="blob-content"):
                text = pretty_blob(self.data)
                yield Static(_json(text) if text.lstrip().startswith(("{", "["))
                             else Text(escape_display(text, layout=True)))
            yield Static(Text("esc to close", "dim"))


class KindPicker(ModalScreen[str | None]):
    """Pick one kind (with its frame count) to filter the timeline by; "" = all kinds."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, kinds: list[tuple[str, int]], current: tuple[str, ...]) -> None:
        super().__init__(classes="wb-modal")
        self.kinds = kinds
        self.current = current

    def compose(self) -> ComposeResult:
        options = [Option(Text("(all kinds)", "italic"), id="")]
        for kind, n in self.kinds:
            label = Text(f"{n:>9,}  ", "dim")
            label.append(escape(kind), "bold" if kind in self.current else "")
            options.append(Option(label, id=kind))
        with Vertical(classes="wb-modal-box", id="kind-box"):
            yield Static(Text("filter by kind (enter to pick, esc to cancel)", "bold"), classes="wb-modal-title")
            yield OptionList(*options, id="kind-list")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id or "")


HELP_TEXT = """\
Sessions screen
  enter  open session      /  filter rows      s  change sort      r  reverse sort

Session screen
  ↑↓ pgup pgdn home end  move in the timeline    enter  fold/unfold a heartbeat run
  /  filter frames: kind:exec_server dir:server "text"  (> client→server, < server→client)
  k  pick a kind from those present (with counts)    d  cycle direction: all → client → server
  escape  clear the filter      z  fold/unfold all heartbeat runs
  t / o / x  Tree / JSON / Hex tab         f / c / b  focus findings / tool calls / blobs
  enter on a finding  jump to its evidence frames (marked ◆)    ] / [  next / previous evidence
  enter on a tool call or blob  open it

Replay
  p  start/stop replay     space  play/pause     . ,  step forward/back
  + -  speed ×0.5 … ×20    i  skip idle gaps (gaps capped at 1 s)
  Frames appear as they did on the wire; findings light up (●) when their evidence is reached.

Everywhere
  ctrl+p  command palette (every action)    ?  this help    q  back / quit
"""


def help_text() -> Text:
    """HELP_TEXT with its section titles (unindented lines) in bold; plain text, so [ ] stay literal."""
    out = Text()
    for line in HELP_TEXT.splitlines(keepends=True):
        out.append(line, "bold" if line.strip() and not line.startswith(" ") else "")
    return out


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, bindings: list[tuple[str, str]] | None = None) -> None:
        super().__init__(classes="wb-modal")
        self.bindings_list = bindings or []

    def compose(self) -> ComposeResult:
        with Vertical(classes="wb-modal-box", id="help-box"):
            yield Static(Text("workbench tui — help", "bold"), classes="wb-modal-title")
            with VerticalScroll():
                yield Static(help_text())
                if self.bindings_list:
                    t = Table(title="Keys on this screen", show_header=False, box=None, padding=(0, 2))
                    t.add_column(style="bold cyan")
                    t.add_column()
                    for key, desc in self.bindings_list:
                        t.add_row(key, desc)
                    yield Static(t)
            yield Static(Text("esc to close", "dim"))
