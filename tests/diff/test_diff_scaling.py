"""`workbench diff` does work linear in the sessions' size (issue 35: difflib's matcher over whole
sessions took 115 s at 40k frames). Not timed: the comparison counts the comparisons it makes
(``Diff.work``: steps and parts walked, frames compared, cells of every bounded matcher), and ten
times the frames must cost about ten times the work, for equal sessions and for sessions that
differ by a changed exec, a moved step, a stall, or everywhere at once. benchmarks/diff.py times it."""

from __future__ import annotations

import pytest
from diff_rig import Session, long_session, view

from workbench.report.session import SessionView
from workbench.sessiondiff import align
from workbench.sessiondiff.compare import diff_sessions
from workbench.sessiondiff.render import human

FRAMES_PER_STEP = 28   # long_session: 20 + 3 text deltas, the exec, its result and close, 2 heartbeats


def _steps(frames: int) -> int:
    return frames // FRAMES_PER_STEP


def _pair(case: str, frames: int) -> tuple[SessionView, SessionView]:
    n = _steps(frames)
    if case == "equal":
        return long_session(n), long_session(n)
    if case == "changed exec":
        return long_session(n), long_session(n, changed=n // 2)
    if case == "moved step":
        return long_session(n), long_session(n, moved=n // 2)
    if case == "stall":
        return long_session(n), long_session(n, stall=frames // 10)
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["equal", "changed exec", "moved step", "stall"])
def test_work_grows_linearly_from_2k_to_20k_frames(case: str) -> None:
    small = diff_sessions(*_pair(case, 2_000))
    big = diff_sessions(*_pair(case, 20_000))
    assert small.same == big.same == (case == "equal")
    ratio = big.work / small.work
    assert 8 <= ratio <= 12, (case, small.work, big.work)   # linear: 10; quadratic would be 100


def _alternating(n: int, other: bool) -> SessionView:
    """Text and KV writes taking turns with no structure at all; ``other``: another text and other
    blobs, a heartbeat before and after, every 50th write left out, so that no step of one has its
    like in the other and their kinds part at the first step and the last: the worst case for the
    matcher, aligned window by window."""
    s = Session()
    if other:
        s.heartbeats(1)
    for i in range(n // 2):
        s.text([f"{'v' if other else 'w'}{i} "])
        if not (other and i % 50 == 7):
            s.add("server", "kv_server_message.set_blob_args", {"kv": {"blob_data": f"{'c' if other else 'b'}{i}"}})
    if other:
        s.heartbeats(1)
    return view(s.frames)


def test_a_session_with_no_structure_that_differs_everywhere_is_windowed_and_linear() -> None:
    small = diff_sessions(_alternating(2_000, False), _alternating(2_000, True))
    big = diff_sessions(_alternating(20_000, False), _alternating(20_000, True))
    assert not big.same and big.aligned_items > 9_000
    assert big.windowed_gaps == 1 and "aligned in windows of 200 steps" in human(big)
    ratio = big.work / small.work
    assert ratio <= 12, (small.work, big.work)
    # per step at most a window's worth of cells: bounded, whatever the size
    assert big.work <= 1.1 * 20_000 * align.WINDOW
