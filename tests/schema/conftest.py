"""Fixtures for schema tests: the real protobuf-es generators from npm (cached per version set)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from js_generators import Generators, install  # noqa: E402


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"protobuf-es generators unavailable in CI: {reason}")
    pytest.skip(f"protobuf-es generators unavailable: {reason}")


@pytest.fixture(scope="session")
def generators() -> Generators:
    if shutil.which("node") is None:
        _unavailable("node is not installed")
    try:
        return Generators(install("v1"), install("v2"))
    except (RuntimeError, OSError) as exc:
        _unavailable(str(exc))
        raise


@pytest.fixture(scope="session")
def next_extracted(generators: Generators, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The schema `schema extract` recovers from the next build's bundle (see next_build.py)."""
    from next_build import extract_next_build

    return extract_next_build(generators, tmp_path_factory.mktemp("next-build"))


@pytest.fixture(scope="session")
def next_proto(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The next build's own .proto files."""
    from next_build import write_next_build

    return write_next_build(tmp_path_factory.mktemp("next-proto"))


@pytest.fixture(scope="session")
def next_recording(next_proto: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A turn of the next build recorded twice through real mitmdumps: into a capture database by
    the addon (no schema configured: the overlay decodes it), and as a flow file (``-w``)."""
    from next_build import ADDON, Mitmdump, RunSseServer, record

    work = tmp_path_factory.mktemp("next-recording")
    db, flows = work / "capture.duckdb", work / "turn.flows"
    isolated = {"XDG_CONFIG_HOME": str(work / "config")}
    server = RunSseServer(next_proto)
    try:
        for args in (["-s", str(ADDON), "--set", f"cursor_db={db}"], ["-w", str(flows)]):
            m = Mitmdump(args, work / "mitm", isolated)
            try:
                record(m.port, server.port)
            finally:
                assert m.stop() == 0, m.log.read_text()
    finally:
        server.close()
    return db, flows
