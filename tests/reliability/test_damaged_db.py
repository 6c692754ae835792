"""Every command that opens a capture database, on a damaged one: exit 2, the file named, no traceback.

Damage kinds (made from a real database written by ``workbench import``): truncated to a third,
zero-filled, wrong checksums (every block, so the file is refused on open; and only the data
blocks, so it opens and fails on the first read), and a text file that is not DuckDB at all.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from support import run_workbench

pytestmark = pytest.mark.slow  # starts subprocesses or servers

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "captures" / "samples" / "cli-stream-json.ndjson"
KINDS = ("truncated", "zero-filled", "checksum-all-blocks", "checksum-data-blocks", "not-duckdb")
HEADERS = 12288       # DuckDB: main header + two database headers
BLOCK = 262144        # DuckDB's default block size


@pytest.fixture(scope="module")
def good_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("damaged")
    db = work / "good.duckdb"
    r = run_workbench("import", str(SAMPLE), "--db", str(db), cwd=work)
    assert r.returncode == 0, r.stderr
    r = run_workbench("sessions", "--json", "--db", str(db), cwd=work)
    assert r.returncode == 0, r.stderr
    session = r.stdout.split('"session_id": "', 1)[1].split('"', 1)[0]
    # the undamaged file works for the queries used below
    for args in (["sql", "SELECT * FROM sessions"], ["frames", session], ["diagnose", session, "--no-write"]):
        r = run_workbench(*args, "--db", str(db), cwd=work)
        assert r.returncode in (0, 1), r.stderr
    return db, session[:8]


def damage(good: Path, kind: str, out: Path) -> Path:
    data = good.read_bytes()
    if kind == "truncated":
        out.write_bytes(data[: len(data) // 3])
    elif kind == "zero-filled":
        out.write_bytes(bytes(len(data)))
    elif kind.startswith("checksum"):
        b = bytearray(data)
        first = 0 if kind == "checksum-all-blocks" else 1
        for block in range(first, (len(b) - HEADERS) // BLOCK + 1):
            start = HEADERS + block * BLOCK + 64
            for off in range(start, min(start + 4096, len(b)), 16):
                b[off] ^= 0xFF
        out.write_bytes(bytes(b))
    else:
        out.write_text("this is a text file, not a DuckDB database\n" * 50)
    return out


COMMANDS: dict[str, list[str]] = {
    "sessions": ["sessions"],
    "frames": ["frames", "{session}"],
    "sql": ["sql", "SELECT * FROM sessions"],
    "diagnose": ["diagnose", "{session}"],
    "diagnose --all": ["diagnose", "--all"],
    "blobs": ["blobs", "{session}"],
    "tools": ["tools", "{session}"],
    "export": ["export", "--parquet", "{work}/parquet"],
    "export-fixture": ["export-fixture", "{session}", "-o", "{work}/fixture.json"],
    "import": ["import", str(SAMPLE)],
    "run": ["run", "--", sys.executable, "-c", "print(1)"],
    "tui": ["tui"],
    "capture": ["capture", "--port", "0", "--confdir", "{work}/mitm"],
    "client --record": ["client", "hello", "--upstream", "https://127.0.0.1:9", "--record", "{db}"],
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_command_on_a_damaged_database_exits_2_naming_it(good_db: tuple[Path, str], kind: str,
                                                                tmp_path: Path) -> None:
    good, session = good_db
    env = {**os.environ, "CURSOR_ACCESS_TOKEN": "not-a-real-token"}
    failures = []
    for name, template in COMMANDS.items():
        work = tmp_path / name.replace(" ", "_")
        work.mkdir()
        db = damage(good, kind, work / f"{kind}.duckdb")
        args = [a.format(session=session, work=work, db=db) for a in template]
        if "--record" not in args:
            args[1:1] = ["--db", str(db)]  # before any "-- CMD"
        r = run_workbench(*args, cwd=work, env=env)
        text = r.stdout + r.stderr
        if r.returncode != 2 or db.name not in r.stderr or "Traceback" in text:
            failures.append(f"{name}: exit {r.returncode}\n{text[-1500:]}")
        assert not (work / "parquet").exists() or not any((work / "parquet").rglob("*.parquet")), name
        shutil.rmtree(work, ignore_errors=True)
    assert not failures, "\n\n".join(failures)
