"""The one base class of the errors a user can meet, and the command-line error.

Every error whose message is meant for a person derives from :class:`WorkbenchError`; its message
names the file, frame or option at fault. ``workbench`` (``workbench.cli.main``) catches this base
alone: it prints ``workbench <command>: <message>`` and exits 2, never a traceback. Library users
(notebooks, the pytest plugin, scripts) can catch the same base.

Each subsystem defines its own error next to the code that raises it, deriving from this base:

- ``CliError`` (here): a bad option, argument or input named on the command line
- ``SchemaError`` (``workbench.schema.loader``), ``ExtractError`` (``workbench.schema.extract``),
  ``MergeError`` (``workbench.schema.merge``)
- ``StoreError`` (``workbench.store.db``), ``SchemaVersionError`` (``workbench.store.schema``),
  ``SessionNotFound`` (``workbench.store.queries``),
  ``QueryRefused`` and its kinds (``workbench.store.readonly``)
- ``IngestError`` (``workbench.ingest``), ``ParquetError`` (``workbench.export.parquet``)
- ``FixtureError`` (``workbench.fixtures.format``), ``ScenarioError`` (``workbench.sim.scenario``)
- ``NetError`` (``workbench.client.net``), ``TransportError`` (``workbench.client.transport``),
  ``AgentError`` (``workbench.client.events``)
- ``NotebookError`` (``workbench.notebook``)

This module imports nothing, so any layer can use it; nothing below the CLI imports
``workbench.cli``. Errors that never leave their subsystem (framing refusals inside the
simulator, an inflate budget, a spool that is full) stay plain exceptions there.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """A user-facing error: the message names the file, frame or option at fault."""


class CliError(WorkbenchError):
    """A bad command line: an option, argument or input named on it cannot be used."""
