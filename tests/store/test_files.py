"""``workbench.store.files.private_files``: after it, what the process creates is owner-only (a
DuckDB database, its write-ahead log, folders), unless ``WORKBENCH_SHARED_FILES=1`` keeps the
user's umask. The umask belongs to the whole process, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Creates a real DuckDB file (and keeps its WAL: no checkpoint on close), a folder and a plain file
# after private_files() (called twice: it must not narrow twice), and prints their modes.
_CREATE = """
import json, os, sys
import duckdb
os.umask(int(sys.argv[2], 8))
from workbench.store.files import private_files
private_files()
private_files()
work = sys.argv[1]
con = duckdb.connect(os.path.join(work, "c.duckdb"))
con.execute("PRAGMA disable_checkpoint_on_shutdown")
con.execute("CREATE TABLE t AS SELECT range AS i FROM range(1000)")
con.close()
os.mkdir(os.path.join(work, "spool"))
with open(os.path.join(work, "export.parquet"), "wb") as fh:
    fh.write(b"PAR1")
modes = {name: oct(os.stat(os.path.join(work, name)).st_mode & 0o777) for name in sorted(os.listdir(work))}
print(json.dumps({"modes": modes, "umask": oct(os.umask(0))}))
"""


def _create(work: Path, umask: str, shared: str | None) -> dict[str, object]:
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin"} | ({"WORKBENCH_SHARED_FILES": shared} if shared is not None else {})
    r = subprocess.run([sys.executable, "-c", _CREATE, str(work), umask], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    result: dict[str, object] = json.loads(r.stdout)
    return result


@pytest.mark.slow
@pytest.mark.parametrize(("umask", "shared", "file_mode", "dir_mode"), [
    ("022", None, "0o600", "0o700"),
    ("027", "0", "0o600", "0o700"),
    ("022", "1", "0o644", "0o755"),
    ("027", "yes", "0o640", "0o750"),
])
def test_files_made_after_private_files(tmp_path: Path, umask: str, shared: str | None, file_mode: str,
                                        dir_mode: str) -> None:
    got = _create(tmp_path / "work", umask, shared)
    modes = got["modes"]
    assert isinstance(modes, dict)
    assert "c.duckdb.wal" in modes, modes  # the WAL is a file of its own, made after the database
    assert modes == {"c.duckdb": file_mode, "c.duckdb.wal": file_mode, "export.parquet": file_mode,
                     "spool": dir_mode}
    private = shared in (None, "0")
    assert got["umask"] == (oct(int(umask, 8) | 0o077) if private else oct(int(umask, 8)))
