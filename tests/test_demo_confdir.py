"""``workbench demo`` leaves nothing behind but its database: its mitmproxy configuration (the
throwaway CA its client trusts) lives in a temporary directory removed when the capture stops.

It used to be a hidden ``.mitmproxy-demo/`` folder next to the database, which with ``--db x.duckdb``
is the current directory. The capture here is the demo's own (``CaptureProcess``: real mitmdump).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.demo import CaptureProcess

pytestmark = pytest.mark.slow  # starts mitmdump


def test_the_demo_capture_leaves_the_working_directory_clean(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    capture = CaptureProcess(Path("demo.duckdb"))
    try:
        capture.start()
        ca = Path(capture.ca_path)
        assert ca.is_file() and work not in ca.parents  # the CA is made, elsewhere
        confdir = capture.confdir
    finally:
        capture.stop()
    assert not confdir.exists()
    left = sorted(p.name for p in work.iterdir())
    assert set(left) <= {"demo.duckdb", "demo.duckdb.wal"}, left
    assert not any(p.name.startswith(".") for p in work.iterdir())


def test_a_confdir_given_is_kept(tmp_path: Path) -> None:
    """Only the temporary directory it made itself is removed (never a directory it was given)."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "keep.txt").write_text("mine")
    capture = CaptureProcess(tmp_path / "d.duckdb", confdir=conf)
    capture.stop()
    assert (conf / "keep.txt").read_text() == "mine"
