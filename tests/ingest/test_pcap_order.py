"""``workbench.ingest.pcap.in_append_order``: frames of a packet capture in the order the server
applies them, with wire times that never go back, and ``arrived_us`` only on an append that waited."""

from __future__ import annotations

from workbench.decode.frame import Frame
from workbench.ingest.identity import PlannedFrame
from workbench.ingest.pcap import in_append_order


def _frame(ts_us: int, transport: str, name: str) -> PlannedFrame:
    return PlannedFrame(ts_us=ts_us, direction="client", transport=transport, stream=None,
                        frame=Frame(kind="client_message", summary=name, payload=name.encode()), source_key=None)


def _names(frames: list[PlannedFrame]) -> list[str]:
    return [pf.frame.summary for pf in frames]


def test_a_run_frame_stamped_before_the_previous_packet_keeps_its_place_without_arrived_us() -> None:
    # Loopback capture: packet 2 (an append) was stamped 3 µs after packet 3 (a run frame) on
    # another CPU but queued first. The run frame waited for nothing: it is not "arrived" late.
    append0, run = _frame(1_000_010, "bidi_append", "append0"), _frame(1_000_007, "run", "run")
    first = _frame(1_000_000, "runsse", "first")
    out = in_append_order([first, append0, run], {id(append0.frame): 0}, None)
    assert _names(out) == ["first", "append0", "run"]
    assert [pf.ts_us for pf in out] == [1_000_000, 1_000_010, 1_000_010]  # times never go back
    assert all("arrived_us" not in (pf.frame.meta or {}) for pf in out)


def test_an_append_that_overtook_the_one_before_waits_for_it_and_keeps_its_arrival() -> None:
    second, first = _frame(2_000_000, "bidi_append", "append1"), _frame(2_000_500, "bidi_append", "append0")
    seqnos = {id(second.frame): 1, id(first.frame): 0}
    out = in_append_order([second, first], seqnos, None)
    assert _names(out) == ["append0", "append1"]
    assert [pf.ts_us for pf in out] == [2_000_500, 2_000_500]
    assert (out[1].frame.meta or {}).get("arrived_us") == 2_000_000
    assert "arrived_us" not in (out[0].frame.meta or {})
