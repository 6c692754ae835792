"""The session screen: timeline, frame detail, findings / tool calls / blobs, replay, follow."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Header, Input, Static, TabbedContent

from workbench.analysis.model import Finding
from workbench.store.view_reads import BlobView, ToolCallView
from workbench.textsafe import escape, escape_display
from workbench.tui.context import STATUS_STYLE, TuiContext, fmt_duration
from workbench.tui.data import FrameDetail, FrameFilter, FrameIndex, LiveFindings, SessionSummary
from workbench.tui.detail import FrameDetailView
from workbench.tui.loading import Loader
from workbench.tui.modals import BlobScreen, KindPicker, ToolCallScreen
from workbench.tui.panels import BlobsTable, FindingsTable, ToolCallsTable
from workbench.tui.replay import ReplayClock
from workbench.tui.replay_control import ReplayController
from workbench.tui.session_loads import IndexLoad, PollResult, poll_session
from workbench.tui.side import SessionSide
from workbench.tui.timeline import Timeline
from workbench.tui.timeline_strip import StripData, TimelineStrip, strip_data

STRIP_REFRESH_S = 1.0   # following a capture: the timeline strip re-reads at most this often
FIRST_PAGE = 120   # rows fetched with the index, so the first paint needs no second round trip
# Opening a session draws its first rows from an index of the frames up to this seq, then reads
# the whole index (a 1M-frame session's index alone took longer than the first-paint budget).
PREFIX_SEQS = 20_000
DETAIL_DELAY_S = 0.05


class SessionScreen(Loader, Screen[None]):
    BINDINGS = [
        Binding("slash", "filter", "Filter", show=True),
        Binding("escape", "back_or_clear", "Back/clear", show=True),
        Binding("q", "back", "Sessions", show=False),
        Binding("p", "replay", "Replay", show=True),
        Binding("space", "play_pause", "Play/pause", show=True),
        Binding("full_stop", "step(1)", "Step ▶", show=True),
        Binding("comma", "step(-1)", "Step ◀", show=False),
        Binding("plus,equals_sign", "speed(1)", "Faster", show=True),
        Binding("minus", "speed(-1)", "Slower", show=False),
        Binding("i", "skip_idle", "Skip idle", show=False),
        Binding("k", "pick_kind", "Kind", show=False),
        Binding("d", "cycle_direction", "Direction", show=False),
        Binding("z", "toggle_fold", "Fold heartbeats", show=False),
        Binding("t", "tab('tab-tree')", "Tree", show=False),
        Binding("o", "tab('tab-json')", "JSON", show=False),
        Binding("x", "tab('tab-hex')", "Hex", show=False),
        Binding("f", "panel('findings')", "Findings", show=True),
        Binding("c", "panel('tool-calls')", "Tool calls", show=False),
        Binding("b", "panel('blobs')", "Blobs", show=False),
        Binding("l", "focus_timeline", "Timeline", show=False),
        Binding("right_square_bracket", "evidence(1)", "Next evidence", show=False),
        Binding("left_square_bracket", "evidence(-1)", "Prev evidence", show=False),
        Binding("s", "jump_stall", "Stall", show=False),
        Binding("r", "report", "Report", show=True),
    ]
    COMMANDS_HELP = {
        "filter": "Filter frames (kind:… dir:… text)", "back_or_clear": "Clear the filter or go back",
        "back": "Back to the sessions list", "replay": "Start or stop replay at the recorded pace",
        "play_pause": "Replay: play or pause", "step(1)": "Replay: step one frame forward",
        "step(-1)": "Replay: step one frame back", "speed(1)": "Replay: faster", "speed(-1)": "Replay: slower",
        "skip_idle": "Replay: toggle skipping idle gaps", "toggle_fold": "Fold or unfold heartbeat runs",
        "pick_kind": "Filter by a kind present in the session", "cycle_direction": "Filter direction: all / client / server",
        "tab('tab-tree')": "Detail: named tree", "tab('tab-json')": "Detail: JSON",
        "tab('tab-hex')": "Detail: hex dump", "panel('findings')": "Show findings",
        "panel('tool-calls')": "Show tool calls", "panel('blobs')": "Show KV blobs",
        "focus_timeline": "Focus the timeline", "evidence(1)": "Next evidence frame",
        "evidence(-1)": "Previous evidence frame", "jump_stall": "Jump to where the session stalled",
        "report": "Write the HTML report of this session and show its path",
    }

    class Closed(Message):
        """The user left the session; the application shows the sessions list."""

    def __init__(self, session_id: str, ctx: TuiContext) -> None:
        super().__init__(id="session-screen")
        self.session_id = session_id
        self.ctx = ctx
        self.summary: SessionSummary | None = None
        self.flt = FrameFilter()
        self.index: FrameIndex | None = None
        self.max_seq = -1
        self.replayer = ReplayController(self, self)
        self._detail_timer: Timer | None = None
        self._live: LiveFindings | None = None
        self.evidence: list[int] = []
        self.evidence_pos = 0
        self._pending_jump: int | None = None
        self.index_complete = False   # the index covers every frame (not only the first PREFIX_SEQS)
        self._polling = False
        self._poll_started = 0.0
        self._strip_read = 0.0

    # layout ------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="session-main"):
            with Vertical(id="left"):
                yield Static("", id="session-status")
                yield Input(placeholder='filter: kind:exec dir:server "text"  (enter to apply, esc to clear)',
                            id="frame-filter", classes="hidden")
                yield TimelineStrip(id="timeline-strip")
                yield Timeline(id="timeline")
                yield Static("", id="replay-bar", classes="hidden")
            yield SessionSide(id="right")   # built once the timeline shows rows (_build_side)
        yield Footer()

    @property
    def timeline(self) -> Timeline:
        return self.query_one("#timeline", Timeline)

    @property
    def side_ready(self) -> bool:
        """The detail and the panels are mounted (they come after the timeline's first rows)."""
        return self.query_one(SessionSide).ready

    async def _build_side(self) -> None:
        side = self.query_one(SessionSide)
        if side.built or not await side.build():
            return
        self._load_panels()
        cur = self.timeline.current
        if cur is None:
            self.query_one("#detail", FrameDetailView).show(None)
        else:
            self._load_detail(cur.seq)

    @property
    def findings_table(self) -> FindingsTable:
        return self.query_one("#findings-table", FindingsTable)

    def on_mount(self) -> None:
        self.title = f"session {escape(self.session_id)}"
        self.sub_title = Path(self.ctx.data.path).name
        self.timeline.focus()
        self._load_index()
        if self.ctx.follow:
            self.set_interval(self.ctx.poll_interval, self._poll, name="session-follow")

    # loading -----------------------------------------------------------------------------------

    def _load_index(self, keep_seq: int | None = None, *, rest: bool = False) -> None:
        """Read the frame index (``rest``: the whole index after a first page from a prefix)."""
        data, sid, flt = self.ctx.data, self.session_id, self.flt
        # a prefix only where the first rows are the ones shown: not following (the tail), no filter
        prefix = self.index is None and keep_seq is None and not flt.active and not self.ctx.follow

        def fetch() -> IndexLoad:
            # max_seq first, then frames up to it: a capture appending meanwhile cannot slip
            # frames between the two reads (follow mode continues from max_seq)
            max_seq = data.max_seq(sid)
            upto = min(max_seq, PREFIX_SEQS - 1) if prefix else max_seq
            index = data.frame_index(sid, flt, upto_seq=upto)
            row = index.row_of_seq(keep_seq) if keep_seq is not None else 0
            refs = index.rows(max(0, row - FIRST_PAGE // 2), max(0, row - FIRST_PAGE // 2) + FIRST_PAGE)
            if self.ctx.follow and keep_seq is None:
                refs += index.rows(len(index) - FIRST_PAGE // 2, len(index))
            rows = data.frame_rows(sid, index.seqs_for(refs)) if not rest else {}
            return IndexLoad(data.start_us(sid), index, max_seq, data.session(sid), rows, upto == max_seq)

        def got(res: IndexLoad) -> None:
            self.max_seq = res.max_seq
            self.summary = res.summary or self.summary
            if self.replay is not None:
                res.index.set_limit(self.replay.seq)
            cur = self.timeline.current if rest else None   # where the user went meanwhile
            keep = self._pending_jump if self._pending_jump is not None else \
                keep_seq if keep_seq is not None else cur.seq if cur is not None else None
            first_load = self.index is None
            self.index_complete = res.complete
            self.index = res.index
            self.timeline.add_rows(res.rows)
            self.timeline.set_index(res.index, res.t0, keep_cursor_seq=keep)
            if not len(res.index) and self.side_ready:
                self.query_one("#detail", FrameDetailView).show(None)
            if first_load and self.ctx.follow and keep is None:
                self.timeline.action_last()   # following a capture: start at the tail, like tail -f
            self._update_status()
            if first_load:
                self.call_after_refresh(self._build_side)   # after the rows are drawn
                # the strip reads every frame of the session: after the first rows, not beside them
                self.call_after_refresh(self._load_strip)
            if not res.complete:
                self._load_index(rest=True)
                return   # a pending jump waits for the whole index
            if self._pending_jump is not None:
                target, self._pending_jump = self._pending_jump, None
                self._jump_to_seq(target)

        self.load(fetch, got, group="index", what=f"reading frames of {sid}")

    def _load_strip(self) -> None:
        self._strip_read = time.monotonic()
        data, sid = self.ctx.data, self.session_id
        strip = self.query_one("#timeline-strip", TimelineStrip)
        self.load(lambda: strip_data(data, sid), strip.set_data, group="strip", what=f"reading the timeline of {sid}")

    def on_timeline_strip_jump(self, message: TimelineStrip.Jump) -> None:
        self._jump_to_seq(message.seq)

    def action_jump_stall(self) -> None:
        got: StripData | None = self.query_one("#timeline-strip", TimelineStrip).data
        if got is None or got.stall_seq is None:
            self.app.notify("no stall in this session" if got is not None else "still reading the timeline")
            return
        self._jump_to_seq(got.stall_seq)

    def action_report(self) -> None:
        from workbench.report.cli import (  # deferred: Jinja2 and the decoder load on use
            report_path,
            write_report,
        )

        db, sid = self.ctx.data.path, self.session_id
        out = report_path(db, sid)

        def done(size: int) -> None:
            self.app.notify(f"report written: {out} ({size:,} bytes)", title="report", timeout=15, markup=False)

        self.load(lambda: write_report([sid], out, db=db), done, group="report", what=f"writing the report of {sid}")

    def _load_panels(self) -> None:
        data, sid = self.ctx.data, self.session_id

        def fetch() -> tuple[list[Finding], list[ToolCallView], list[BlobView]]:
            return data.findings(sid), data.tool_calls(sid), data.blobs(sid)

        def got(res: tuple[list[Finding], list[ToolCallView], list[BlobView]]) -> None:
            self.findings_table.set_findings(res[0])
            self._show_finding_text()
            self.query_one("#tools-table", ToolCallsTable).set_records(res[1])
            self.query_one("#blobs-table", BlobsTable).set_records(res[2])
            self._update_panel_titles()
            self._update_lit()

        self.load(fetch, got, group="panels", what=f"reading findings of {sid}")

    def _update_panel_titles(self) -> None:
        panels = self.query_one("#panels", TabbedContent)
        found = self.findings_table.findings
        notes = sum(1 for f in found if f.severity == "note")  # an older workbench's "info" rows show as they were
        for pane_id, n in (("findings", len(found) - notes),
                           ("tool-calls", len(self.query_one("#tools-table", ToolCallsTable).records)),
                           ("blobs", len(self.query_one("#blobs-table", BlobsTable).records))):
            label = {"findings": "Findings", "tool-calls": "Tool calls", "blobs": "Blobs"}[pane_id]
            # notes never count as findings: they follow them in the table and are counted apart
            extra = f" + {notes} note{'s' if notes != 1 else ''}" if pane_id == "findings" and notes else ""
            panels.get_tab(pane_id).label = f"{label} ({n}{extra})"

    def on_timeline_need_rows(self, message: Timeline.NeedRows) -> None:
        data, sid, seqs = self.ctx.data, self.session_id, message.seqs
        self.load(lambda: data.frame_rows(sid, seqs), self.timeline.add_rows, group="rows",
                  what="reading timeline rows", exclusive=False)

    def on_timeline_highlighted(self, message: Timeline.Highlighted) -> None:
        # decode after the cursor rests a moment: holding an arrow key should not decode every row
        if self._detail_timer is not None:
            self._detail_timer.stop()
        seq = message.row.seq
        self._detail_timer = self.set_timer(DETAIL_DELAY_S, lambda: self._load_detail(seq))

    def _load_detail(self, seq: int) -> None:
        if not self.side_ready:
            return   # _build_side shows the frame under the cursor
        data, sid = self.ctx.data, self.session_id
        detail = self.query_one("#detail", FrameDetailView)
        if detail.detail is not None and detail.detail.seq == seq:
            return

        def got(d: FrameDetail | None) -> None:
            detail.show(d)

        self.load(lambda: data.frame_detail(sid, seq), got, group="detail", what=f"decoding frame {seq}")

    def on_timeline_selected(self, message: Timeline.Selected) -> None:
        row = message.row
        if row.fold or row.member:
            first = row.seq if row.fold else self._run_first(row.seq)
            if self.index is not None and first is not None:
                self.index.toggle(first)
                self.timeline.index_changed()
                self.timeline.cursor = self.index.row_of_seq(first)

    def _run_first(self, seq: int) -> int | None:
        if self.index is None:
            return None
        j = self.index._run_of_index(self.index.index_of(seq))
        return None if j is None else int(self.index.seqs[self.index.run_start[j]])

    def _update_status(self) -> None:
        s = self.summary
        t = Text()
        # status and label first: they are what a narrow pane must not cut
        if s is not None:
            t.append(escape(s.status), STATUS_STYLE.get(s.status, "yellow"))
            t.append("  ")
        # ids, labels, models: the capture's, escaped (workbench.textsafe)
        t.append(escape(self.session_id), "bold")
        if s is not None and s.label:
            t.append(f"  “{escape(s.label)}”")
        if self.index is not None and not self.index_complete:
            t.append(f"\nframes 0…{self.max_seq}, the first {self.index.total} shown while the rest are read")
        elif self.index is not None:
            shown = self.index.total
            t.append(f"\n{shown} frames" if not self.flt.active else
                     f"\n{shown} of {self.max_seq + 1} frames match {self.flt.describe()}")
            t.append(f" · {len(self.index)} rows", "dim")
        if s is not None:
            t.append(f" · {escape(s.source)} · {escape(s.transport)} · {escape(s.model) or '?'} · "
                     f"{fmt_duration(s.duration_s)}", "dim")
        if self.ctx.data.live:
            t.append("  ● live", "bold green")
        self.query_one("#session-status", Static).update(t)

    # filter ------------------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#frame-filter", Input)
        box.remove_class("hidden")
        box.value = self.flt.describe()
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "frame-filter":
            return
        try:
            flt = FrameFilter.parse(event.value)
        except ValueError as exc:
            self.app.notify(str(exc), title="filter", severity="error", markup=False)
            return
        self.apply_filter(flt)
        if not flt.active:
            event.input.add_class("hidden")
        self.timeline.focus()

    def apply_filter(self, flt: FrameFilter) -> None:
        cur = self.timeline.current
        self.flt = flt
        self.timeline.clear_cache()
        self._load_index(keep_seq=cur.seq if cur is not None else None)

    def action_pick_kind(self) -> None:
        data, sid = self.ctx.data, self.session_id

        def picked(kind: str | None) -> None:
            if kind is not None:
                self.apply_filter(FrameFilter((kind,) if kind else (), self.flt.direction, self.flt.text))

        def show(kinds: list[tuple[str, int]]) -> None:
            self.app.push_screen(KindPicker(kinds, self.flt.kinds), picked)

        self.load(lambda: data.kind_counts(sid), show, group="kinds", what=f"counting kinds of {sid}")

    def action_cycle_direction(self) -> None:
        nxt = {None: "client", "client": "server", "server": None}[self.flt.direction]
        self.apply_filter(FrameFilter(self.flt.kinds, nxt, self.flt.text))
        self.app.notify(f"direction: {nxt or 'both'}", timeout=2)

    def action_back_or_clear(self) -> None:
        box = self.query_one("#frame-filter", Input)
        if self.flt.active or not box.has_class("hidden"):
            box.value = ""
            box.add_class("hidden")
            if self.flt.active:
                self.apply_filter(FrameFilter())
            self.timeline.focus()
        elif self.replayer.active:
            self.replayer.stop()
        else:
            self.action_back()

    def action_back(self) -> None:
        self.post_message(self.Closed())

    # detail & panels ---------------------------------------------------------------------------

    def action_tab(self, tab: str) -> None:
        if not self.side_ready:
            return
        self.query_one("#detail", FrameDetailView).active = tab

    def action_panel(self, pane: str) -> None:
        if not self.side_ready:
            return
        self.query_one("#panels", TabbedContent).active = pane
        table = {"findings": "#findings-table", "tool-calls": "#tools-table", "blobs": "#blobs-table"}[pane]
        self.query_one(table, DataTable).focus()

    def action_focus_timeline(self) -> None:
        self.timeline.focus()

    def action_toggle_fold(self) -> None:
        if self.index is None:
            return
        cur = self.timeline.current
        self.index.set_fold(not self.index.fold)
        self.timeline.index_changed()
        if cur is not None:
            self.timeline.jump_to_row(max(0, self.index.row_of_seq(cur.seq)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, FindingsTable):
            self._show_finding_text()

    def _show_finding_text(self) -> None:
        f = self.findings_table.selected()
        text = Text()
        if f is not None:
            text.append(f"{escape(f.code)}: ", "bold")
            text.append(escape_display(f.message))
            if f.suggested_fix:
                text.append("\nfix: ", "bold green")
                text.append(escape_display(f.suggested_fix))
            text.append(f"\nevidence: {', '.join(map(str, f.evidence[:20]))}"
                        + (" …" if len(f.evidence) > 20 else "") + "   (enter: jump)", "dim")
        self.query_one("#finding-text", Static).update(text)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        table = event.data_table
        if isinstance(table, FindingsTable):
            f = table.selected()
            if f is not None:
                self.jump_to_evidence(f.evidence)
        elif isinstance(table, ToolCallsTable):
            call = table.selected()
            if call is not None:
                self.app.push_screen(ToolCallScreen(call))
        elif isinstance(table, BlobsTable):
            blob = table.selected()
            if blob is not None:
                data, sid = self.ctx.data, self.session_id

                def show(raw: bytes | None) -> None:
                    self.app.push_screen(BlobScreen(blob, raw))

                self.load(lambda: data.blob_data(sid, blob["blob_id"]), show, group="blob",
                          what=f"reading blob {blob['blob_id'][:12]}")

    def jump_to_evidence(self, seqs: Sequence[int]) -> None:
        """Move the timeline to a finding's first evidence frame and mark all of them."""
        if not seqs:
            self.app.notify("this finding names no frames", severity="warning")
            return
        self.evidence = sorted(seqs)
        self.evidence_pos = 0
        self.timeline.set_evidence(set(self.evidence))
        if self.index is not None:
            for seq in self.evidence[1:]:
                self.index.expand_around(seq)
        self._jump_to_seq(self.evidence[0])

    def _jump_to_seq(self, seq: int) -> None:
        index = self.index
        if index is None or not self.index_complete:
            self._pending_jump = seq   # done when the (whole) index is there
            return
        if index.index_of(seq) < 0:
            if self.flt.active:
                self.app.notify("the filter hid the evidence frames: filter cleared")
                self._pending_jump = seq
                self.query_one("#frame-filter", Input).add_class("hidden")
                self.flt = FrameFilter()
                self.timeline.clear_cache()
                self._load_index()
            else:
                self.app.notify(f"frame {seq} is not in this session", severity="warning")
            return
        self.replayer.reach(seq)   # a replay that has not reached the evidence yet moves there
        index.expand_around(seq)
        self.timeline.index_changed()
        self.timeline.jump_to_row(index.row_of_seq(seq))
        self.timeline.focus()

    def action_evidence(self, delta: int) -> None:
        if not self.evidence:
            self.app.notify("select a finding first (f, then enter)")
            return
        self.evidence_pos = (self.evidence_pos + delta) % len(self.evidence)
        self._jump_to_seq(self.evidence[self.evidence_pos])

    # replay (played by ReplayController; the screen shows what it reached) ----------------------

    @property
    def replay(self) -> ReplayClock | None:
        """The running replay's clock; None when not replaying."""
        return self.replayer.clock

    def action_replay(self) -> None:
        if self.replayer.active:
            self.replayer.stop()
            return
        data, sid = self.ctx.data, self.session_id
        self.replayer.start(lambda: data.timestamps(sid), what=f"reading timestamps of {sid}")

    def replay_started(self) -> None:
        self.timeline.focus()

    def show_replay(self, seq: int, follow_cursor: bool) -> bool:
        if self.index is None:
            return False
        self.index.set_limit(seq)
        self.timeline.index_changed()
        if follow_cursor:
            self.timeline.action_last()
        self._update_lit()
        return True

    def replay_stopped(self) -> None:
        if self.index is not None:
            self.index.set_limit(None)
            self.timeline.index_changed()
        if self.side_ready:
            self.findings_table.set_lit(None)
        self._update_status()

    def _update_lit(self) -> None:
        if not self.side_ready:
            return
        self.findings_table.set_lit(None if self.replay is None else self.findings_table.lit_by(self.replay.seq))

    def action_play_pause(self) -> None:
        self.replayer.play_pause()

    def action_step(self, delta: int) -> None:
        self.replayer.step(delta)

    def action_speed(self, delta: int) -> None:
        self.replayer.speed(delta)

    def action_skip_idle(self) -> None:
        self.replayer.skip_idle()

    # follow ------------------------------------------------------------------------------------

    def _live_findings_source(self) -> LiveFindings | None:
        """The incremental analyzer, while the capture is live (else stored findings suffice)."""
        if self._live is None and self.ctx.data.live:
            self._live = LiveFindings(self.session_id)
        return self._live

    def _poll(self) -> None:
        # a poll that failed never clears the flag: retry after a while instead of never
        if (self._polling and time.monotonic() - self._poll_started < 10) or self.index is None \
                or self.app.screen is not self:
            return
        self._polling = True
        self._poll_started = time.monotonic()
        data, sid, flt, after = self.ctx.data, self.session_id, self.flt, self.max_seq

        live = self._live_findings_source()

        def fetch() -> PollResult:
            return poll_session(data, sid, flt, after, live)

        def got(res: PollResult) -> None:
            self._polling = False
            index = self.index
            if index is None or flt != self.flt or after != self.max_seq:
                return   # a reload happened meanwhile; the next poll starts from its state
            at_tail = self.timeline.cursor >= len(index) - 1
            self.max_seq = res.max_seq
            self.summary = res.summary or self.summary
            if len(res.seqs):
                index.extend(res.seqs, res.hb, res.up)
                if self.replay is not None:
                    index.set_limit(self.replay.seq)
                self.timeline.index_changed()
                if at_tail and self.replay is None:
                    self.timeline.action_last()
            strip = self.query_one("#timeline-strip", TimelineStrip).data
            behind = strip is None or (len(strip.seq) and int(strip.seq[-1]) < self.max_seq)
            if behind and time.monotonic() - self._strip_read >= STRIP_REFRESH_S:
                self._load_strip()   # seqs are dense: the strip has not seen the newest frames
            if self.side_ready:
                self.findings_table.set_findings(res.findings)
                self._show_finding_text()
                self._update_panel_titles()
                self._update_lit()
            self._update_status()

        self.load(fetch, got, group="follow", what=f"following {sid}")
