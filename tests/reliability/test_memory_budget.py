"""Bounded memory (issue 12, item 3): the 8 × 200 MiB gzip flow file, imported and read back.

Peak RSS is measured on real ``workbench`` subprocesses (``getrusage(RUSAGE_CHILDREN)`` in a fresh
wrapper process, so only that command counts) against a generous bound; the figures themselves
are printed by ``benchmarks/memory.py``. Smaller files check each budget (frame, session, import),
that a frame over budget keeps its compressed bytes and an error naming the budget, and that it is
inflated when somebody looks at it.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import WORKBENCH, load_benchmark, run_workbench

from workbench.decode import fields_of
from workbench.decode.classify import default_decoder
from workbench.wire.envelope import FLAG_COMPRESSED, encode
from workbench.wire.inflate import MIB, InflateBudget, InflateOverBudget, inflate_limited, use_budget

GIB_KIB = 1024 * 1024


MEM = load_benchmark("memory")


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.flows"
    MEM.build_flow_file(path, frames=8, inflated_mb=200)
    assert path.stat().st_size < 2_000_000  # ~1.6 MB holding 1.6 GB once inflated
    return path


@pytest.mark.slow
def test_bomb_flow_file_imports_and_reads_back_under_1_gib(bomb: Path, tmp_path: Path) -> None:
    db = tmp_path / "bomb.duckdb"
    r = MEM.measure([*WORKBENCH, "import", str(bomb), "--db", str(db)])
    assert r["rc"] == 0, r["err"]
    assert r["rss_kib"] < GIB_KIB, f"import peaked at {r['rss_kib'] // 1024} MiB"
    # nothing lost: eight frames, each with its compressed bytes and an error naming the budget
    out = run_workbench("sql", "SELECT kind, flags, size, error FROM frames WHERE direction = 'server' ORDER BY seq",
              "--db", str(db), "--json").stdout
    rows = [json.loads(line) for line in out.splitlines()]
    compressed = [row for row in rows if row["kind"] == "compressed"]
    assert len(compressed) == 8
    assert rows[-1]["kind"] == "end_stream"
    for row in compressed:
        assert row["flags"] & FLAG_COMPRESSED
        assert 100_000 < row["size"] < 400_000
        assert "32 MiB per-frame inflate budget" in row["error"]
        assert "--inflate-frame-mb" in row["error"]
    assert db.stat().st_size < 64 * MIB
    for args in (["frames", MEM.SESSION_KEY], ["diagnose", MEM.SESSION_KEY, "--no-write"],
                 ["export", "--parquet", str(tmp_path / "pq")]):
        r = MEM.measure([*WORKBENCH, *args, "--db", str(db)])
        assert r["rc"] in (0, 1), r["err"]
        assert r["rss_kib"] < GIB_KIB, f"{args[0]} peaked at {r['rss_kib'] // 1024} MiB"


@pytest.mark.slow
def test_frames_json_inflates_each_frame_when_viewed(tmp_path: Path) -> None:
    flows = MEM.build_flow_file(tmp_path / "two.flows", frames=2, inflated_mb=40)
    db = tmp_path / "two.duckdb"
    assert run_workbench("import", str(flows), "--db", str(db)).returncode == 0
    out = tmp_path / "frames.jsonl"
    with out.open("w") as fh:
        r = subprocess.run([*WORKBENCH, "frames", MEM.SESSION_KEY, "--json", "--kind", "compressed", "--db", str(db)],
                           stdout=fh, stderr=subprocess.PIPE, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with out.open() as fh:
        docs = [json.loads(line) for line in fh]
    assert [d["kind"] for d in docs] == ["compressed", "compressed"]
    for d, letter in zip(docs, "ab", strict=True):
        inflated = d["fields"]["$inflated"]
        assert inflated["kind"] == "interaction_update.text_delta"
        assert inflated["size"] > 40 * MIB
        text = d["fields"]["interaction_update"]["text_delta"]["text"]
        assert len(text) == 40 * MIB
        assert text[:3] == letter * 3


@pytest.mark.slow
def test_each_budget_and_its_option(tmp_path: Path) -> None:
    flows = MEM.build_flow_file(tmp_path / "eight.flows", frames=8, inflated_mb=3)

    def kinds(*options: str) -> list[tuple[str, str]]:
        db = tmp_path / f"db{len(list(tmp_path.glob('*.duckdb')))}.duckdb"
        r = run_workbench("import", str(flows), "--db", str(db), *options)
        assert r.returncode == 0, r.stderr
        r = run_workbench("sql", "SELECT kind, coalesce(error, '') AS error FROM frames WHERE direction = 'server' "
                "AND kind <> 'end_stream' ORDER BY seq", "--db", str(db), "--json")
        return [(d["kind"], d["error"]) for d in map(json.loads, r.stdout.splitlines())]

    assert {k for k, _ in kinds()} == {"interaction_update.text_delta"}          # 3 MiB each: under every default
    got = kinds("--inflate-frame-mb", "2")
    assert {k for k, _ in got} == {"compressed"}
    assert "2 MiB per-frame" in got[0][1]
    got = kinds("--inflate-session-mb", "10")                                    # three fit in 10 MiB
    assert [k for k, _ in got] == ["interaction_update.text_delta"] * 3 + ["compressed"] * 5
    assert "10 MiB per-session inflate budget" in got[3][1]
    got = kinds("--inflate-import-mb", "7")
    assert [k for k, _ in got] == ["interaction_update.text_delta"] * 2 + ["compressed"] * 6
    assert "7 MiB per-import inflate budget" in got[2][1]
    assert "--inflate-import-mb" in got[2][1]
    r = run_workbench("import", str(flows), "--db", str(tmp_path / "bad.duckdb"), "--inflate-frame-mb", "0")
    assert r.returncode == 2
    assert "--inflate-frame-mb" in r.stderr


def test_stream_decoder_keeps_an_over_budget_frame_and_inflates_it_on_view() -> None:
    """The capture/client path: the same budget applies to a streamed body fed in chunks."""
    dec = default_decoder()
    big = MEM.gzip_text_delta(5 * MIB)
    small = gzip.compress(MEM.plain_text_delta(1000))
    body = encode(small, flags=FLAG_COMPRESSED) + encode(big, flags=FLAG_COMPRESSED)
    with use_budget(InflateBudget(frame=4 * MIB)):
        stream = dec.stream("run", "server")
        frames = [f for i in range(0, len(body), 7000) for f in stream.feed(body[i:i + 7000])] + stream.close()
    assert [f.kind for f in frames] == ["interaction_update.text_delta", "compressed"]
    assert frames[1].payload == big
    assert "4 MiB per-frame" in (frames[1].error or "")
    tree = fields_of(dec, frames[1].kind, frames[1].payload, frames[1].msg_type, frames[1].flags)
    assert tree["$inflated"]["kind"] == "interaction_update.text_delta"
    assert len(tree["interaction_update"]["text_delta"]["text"]) == 5 * MIB
    # viewing is bounded too: past the viewing limit the frame stays an error, never an allocation
    with pytest.raises(InflateOverBudget):
        dec.inflate_compressed(big, frames[1].msg_type, limit=1 * MIB)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=4096), limit=st.integers(min_value=0, max_value=5000))
def test_inflate_limited_is_exact_or_refuses(data: bytes, limit: int) -> None:
    packed = gzip.compress(data)
    if len(data) <= limit:
        assert inflate_limited(packed, limit) == data
    else:
        with pytest.raises(InflateOverBudget):
            inflate_limited(packed, limit)
    with pytest.raises(ValueError):
        inflate_limited(packed[: max(1, len(packed) // 2)], 10_000)
