"""The default limits of a read-only query, apart from ``readonly`` so that ``workbench sql --help``
can show them without loading DuckDB."""

from __future__ import annotations

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_RESULT_BYTES = 256 * 1024 * 1024
