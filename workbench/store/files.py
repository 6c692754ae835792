"""Files the workbench creates are private (0600, folders 0700) unless the user says otherwise.

A capture database holds prompts, code and command output, and DuckDB creates its file and its
write-ahead log with the process umask (0644 under the usual 022): any local user could read
them. ``private_files`` narrows the umask of the process, once, so every file created afterwards
(database, WAL, spool, Parquet exports, fixtures, notebooks' copies) is owner-only; DuckDB
re-creates the WAL after each checkpoint, which a one-off ``chmod`` would miss. Setting
``WORKBENCH_SHARED_FILES=1`` keeps the user's umask (files as shared as the user's other files).
"""

from __future__ import annotations

import os

SHARED_ENV = "WORKBENCH_SHARED_FILES"
_done = False


def shared_files_wanted() -> bool:
    return os.environ.get(SHARED_ENV, "").strip().lower() in ("1", "true", "yes")


def private_files() -> None:
    """Make this process create owner-only files (idempotent; a no-op when the user opted out)."""
    global _done
    if _done or shared_files_wanted():
        return
    old = os.umask(0o077)
    os.umask(old | 0o077)
    _done = True
