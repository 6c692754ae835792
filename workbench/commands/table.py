"""The table of top-level commands: name, one-line help, the module that registers it.

This is the one home of each command's one-line help. ``workbench --help`` lists the table without
importing any command module (start-up, see ``workbench.cli``), and each module's ``register()``
adds its commands with ``add_command``, which takes the help from here, so the two cannot differ.
It imports nothing heavy: ``workbench --help`` loads it on every call.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["COMMANDS", "COMMAND_MODULES", "add_command"]

# (command, one-line help, module that registers it), in the order `workbench --help` lists them.
COMMANDS: list[tuple[str, str, str]] = [
    ("demo", "run the demo: simulator, live capture, broken sessions, diagnosis, TUI", "workbench.demo"),
    ("decode", "decode frames given as hex, a file or stdin", "workbench.commands.core"),
    ("sessions", "list captured sessions", "workbench.commands.core"),
    ("frames", "list the frames of one session", "workbench.commands.core"),
    ("sql", "run a read-only SQL query against the capture database", "workbench.commands.core"),
    ("tui", "browse captures in a terminal UI", "workbench.tui.cli"),
    ("web", "browse captures in a browser (the TUI, served on 127.0.0.1)", "workbench.web.cli"),
    ("capture", "record agent traffic through mitmproxy (mitmdump + the capture addon)", "workbench.capture.cli"),
    ("sim", "run a simulated Cursor agent backend on loopback (h2 + HTTP/1.1, TLS)", "workbench.sim.cli"),
    ("proxy", "OpenAI-compatible server in front of the agent backend", "workbench.proxy.cli"),
    ("client", "run one agent turn with the built-in client and print the answer", "workbench.proxy.cli"),
    ("import", "import mitmproxy flow files, HAR files, cursor-agent stream-json NDJSON or packet captures",
     "workbench.ingest.cli"),
    ("run", "run a CLI (cursor-agent … --output-format stream-json) and record its NDJSON live",
     "workbench.ingest.cli"),
    ("export-fixture", "write a session as a scrubbed, self-contained replay fixture", "workbench.fixtures.cli"),
    ("replay", "serve a fixture as an agent backend for any client", "workbench.fixtures.cli"),
    ("export", "export the capture database as Parquet (partitioned by date and session)", "workbench.export.cli"),
    ("diagnose", "diagnose sessions; exit 1 when a warning or error is found", "workbench.analysis.cli"),
    ("blobs", "the KV blobs of a session (set/get, content, checkpoint refs)", "workbench.analysis.cli"),
    ("tools", "the tool calls of a session, args rebuilt (streamed/completion/merged/naive)",
     "workbench.analysis.cli"),
    ("diff", "compare two sessions (kinds, fields, execs, tool args, timing, ending); exit 1 when they differ",
     "workbench.sessiondiff.cli"),
    ("report", "write a self-contained HTML report of sessions (sequence diagram, timeline, findings, frames)",
     "workbench.report.cli"),
    ("schema", "extract, choose, compare protobuf schemas; find drift in captures", "workbench.commands.schema"),
]

# Modules that add commands, in the order `workbench --help` lists them.
COMMAND_MODULES = list(dict.fromkeys(module for _, _, module in COMMANDS))

_HELP = {name: help_text for name, help_text, _ in COMMANDS}


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                **kwargs: Any) -> argparse.ArgumentParser:
    """Add the top-level command ``name`` with its help from ``COMMANDS``; ``kwargs`` go to ``add_parser``.

    A name the table lacks is a programming error: the command would be missing from
    ``workbench --help`` and unreachable, since the CLI only loads modules the table names.
    """
    if name not in _HELP:
        raise LookupError(f"command {name!r} is not in workbench.commands.table.COMMANDS")
    return sub.add_parser(name, help=_HELP[name], **kwargs)
