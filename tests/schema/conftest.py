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
