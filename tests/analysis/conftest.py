from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.store.db import Store


@pytest.fixture
def analysis_store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "analysis.duckdb")
    yield store
    store.close()
