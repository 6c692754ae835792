"""DuckDB storage: schema and migrations, the single writer, readers (live or not) and the named
reads every view does over them (``queries``; ``Reader`` is the one type that reads)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.store.db import (
        DEFAULT_DB,
        FrameBatch,
        SessionInfo,
        Store,
        StoreError,
        now_us,
        us_to_datetime,
    )
    from workbench.store.queries import Reader
    from workbench.store.reader import LiveService, open_reader
    from workbench.store.schema import SCHEMA_VERSION

__all__ = ["DEFAULT_DB", "SCHEMA_VERSION", "FrameBatch", "LiveService", "Reader", "SessionInfo", "Store", "StoreError",
           "now_us", "open_reader", "us_to_datetime"]

# Resolved on first use, so that importing a light submodule (store.paths) does not load duckdb
# and pyarrow for commands that never open a database.
_HOME = {"DEFAULT_DB": "db", "FrameBatch": "db", "SessionInfo": "db", "Store": "db", "StoreError": "db",
         "now_us": "db", "us_to_datetime": "db", "LiveService": "reader", "open_reader": "reader", "Reader": "queries",
         "SCHEMA_VERSION": "schema"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'workbench.store' has no attribute {name!r}")
    return getattr(importlib.import_module(f"workbench.store.{_HOME[name]}"), name)
