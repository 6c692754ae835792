"""DuckDB storage: schema and migrations, the single writer, and readers (live or not)."""

from workbench.store.db import DEFAULT_DB, FrameBatch, SessionInfo, Store, StoreError, now_us, us_to_datetime
from workbench.store.reader import LiveService, open_reader
from workbench.store.schema import SCHEMA_VERSION

__all__ = ["DEFAULT_DB", "SCHEMA_VERSION", "FrameBatch", "LiveService", "SessionInfo", "Store", "StoreError",
           "now_us", "open_reader", "us_to_datetime"]
