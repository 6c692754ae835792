"""Fixtures for import tests: sample files and agent traffic recorded by a real mitmdump."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from import_rig import HEALTHY, Recording, record

DATA = Path(__file__).parent / "data"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"ingest_data_{name}", DATA / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def ingest_traffic_mod() -> ModuleType:
    return _load("agent_traffic")


@pytest.fixture(scope="session")
def ingest_recorded(tmp_path_factory: pytest.TempPathFactory, ingest_traffic_mod: ModuleType) -> tuple[Path, Path]:
    """(flow file, HAR) freshly recorded by mitmdump in front of a small agent server."""
    out = tmp_path_factory.mktemp("ingest-traffic")
    flows, har = ingest_traffic_mod.generate(out)
    return flows, har


@pytest.fixture
def ingest_copy(tmp_path: Path):
    """Copy a file into the test's tmp dir (imports skip content they have seen, per DB)."""
    def copy(src: Path, name: str | None = None) -> Path:
        dst = tmp_path / (name or src.name)
        shutil.copyfile(src, dst)
        return dst
    return copy


@pytest.fixture
def ingest_sample() -> Path:
    return DATA / "stream-json.ndjson"


@pytest.fixture(scope="session")
def ingest_live(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """Healthy turns (Run and RunSSE + BidiAppend) recorded live, as a whole-body flow file and as HAR."""
    return record(tmp_path_factory.mktemp("ingest-live"), [(s, t) for t in ("run", "runsse") for s in HEALTHY])
