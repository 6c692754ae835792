"""The table of top-level commands: name, one-line help, the module that registers it, and what each
command's own ``--help`` says about it.

This is the one home of each command's help text: the line ``workbench --help`` lists (without
importing any command module, see ``workbench.cli``) and the paragraph above the command's own
options. Each module's ``register()`` adds its commands with ``add_command``, which takes both from
here, so the list and the commands cannot differ. The options stay with the module that reads them.
It imports nothing heavy: ``workbench --help`` loads it on every call.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["COMMANDS", "COMMAND_MODULES", "DESCRIPTIONS", "add_command"]

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
    ("export", "export sessions as Parquet (partitioned by date and session) or as OpenTelemetry traces", "workbench.export.cli"),
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

# What `workbench NAME --help` says about each command, above its options.
DESCRIPTIONS: dict[str, str] = {
    "demo": ("Recreate the demo database (--db): start the simulated agent backend and a live capture through "
             "mitmproxy, run healthy and broken agent sessions through them, diagnose the sessions and open the "
             "TUI on the result (--no-tui when not on a terminal)."),
    "decode": ("Decode bytes exactly as a transport carries them: the enveloped frame(s) for run/runsse/runpoll, the "
               "request body for bidi_append and unary."),
    "sessions": ("One row per session: id, label (scenario name or an excerpt of the first prompt), source, transport, "
                 "model, start, duration, frames, status, the number of findings and the top finding (the root cause, "
                 "when one finding explains others)."),
    "frames": ("The frames of one session in order: seq, time, direction, kind and a one-line summary; --json adds "
               "the decoded fields. --kind and --direction filter; --follow keeps printing new frames while the "
               "capture is in progress."),
    "sql": ("Run read-only SQL (SELECT, or EXPLAIN [ANALYZE] of a SELECT) on the capture database, or through a "
            "running capture's live read service. SQL cannot read or write files or the network, change settings, "
            "or write the database."),
    "tui": ("Open a Textual app over a capture database: sessions, a frame timeline with decoded detail, findings "
            "with their evidence frames, tool calls, KV blobs, replay at the recorded pace. Press ? inside for "
            "keys."),
    "web": ("Serve the TUI to a web browser with textual-serve: the same sessions list, timeline, decoded frames, "
            "findings and replay as 'workbench tui', one TUI process per open page. Listens on 127.0.0.1 only; "
            "requests whose Host is not a loopback name or that come from another web page (Origin) are refused "
            "with 403. Prints the URL to open."),
    "capture": ("Run mitmdump with the workbench capture addon. Prints the proxy URL first, then the CA certificate "
                "and the environment lines a client needs (in reverse mode, the base URL clients use instead of a "
                "proxy). Arguments after -- go to mitmdump unchanged (e.g. -- --set ssl_insecure=true in front of the "
                "simulator). Exit status 3: frames were lost because neither the database nor any spool location "
                "took them. With --keylog: no proxy; packets (tcpdump or dumpcap) and the client's TLS key log are "
                "recorded and imported on Ctrl-C (docs/capture.md, \"Capturing without a proxy\"); exit status 1 then "
                "means a connection could not be decrypted."),
    "sim": ("Serve /agent.v1.AgentService/Run (h2 bidi), RunSSE + BidiAppend, RunPoll and both GetUsableModels, "
            "each in the caller's framing (Connect, gRPC-Web, gRPC). Prints the URL first, then the certificate "
            "path. A request picks a scenario with [scenario:NAME] in the user prompt; others get --scenario."),
    "proxy": ("Serve /v1/models and /v1/chat/completions, translating to Cursor's agent protocol. Prints the URL it "
              "listens on as the first line."),
    "client": ("Send PROMPT to the agent backend and stream the answer to stdout."),
    "import": ("Import recorded traffic into the capture database. The format is detected from the content: "
               "mitmproxy flow files (mitmdump -w), HAR (log.entries), cursor-agent --output-format stream-json "
               "NDJSON, pcap/pcapng packet captures (decrypted by tshark with --keylog). Imports are idempotent: "
               "what a file holds is stored once (importing it again, or a grown copy, adds only what is new), and "
               "an interrupted import is completed by running it again. Exit status 1: a packet capture held TLS "
               "connections that could not be decrypted (no key for them)."),
    "run": ("Runs CMD with its output passed through unchanged, recording each stdout line as a cli_ndjson frame "
            "as it arrives. Exits with CMD's exit code. Example: workbench run -- cursor-agent -p --output-format "
            "stream-json 'fix the test'"),
    "export-fixture": ("Write one session (frames with direction, transport and timing, metadata, findings) as a versioned "
                       "JSON fixture for `workbench replay` and the pytest `cursor_replay` fixture. Secrets are always "
                       "scrubbed. See docs/fixtures.md."),
    "replay": ("Serve a recorded session as a Cursor agent backend (Run, RunSSE + BidiAppend or RunPoll, as "
               "recorded) and check the client's messages against the recording by kind and ids. Prints the URL "
               "first; Ctrl-C stops. Exit status 1 when a client deviated."),
    "export": ("Write sessions, frames, blobs, tool_calls and findings as a Hive-partitioned Parquet dataset "
               "(URI/<table>/date=YYYY-MM-DD/session_id=<id>/part-0.parquet, then URI/_sessions/session_id=<id>.json "
               "last: readers count only sessions with one) in a folder or at s3://, gs://, abfs://, for DuckDB, "
               "Spark, Polars or any Parquet engine. A session already there unchanged is not shipped again; one a "
               "capture is still recording is skipped. `workbench import DIR` reads a folder back. "
               "With `--otlp URL`, sends the sessions as "
               "OpenTelemetry GenAI traces (invoke_agent, chat, execute_tool spans; findings as span events) "
               "to an OTLP/HTTP backend (docs/otel.md)."),
    "diagnose": ("Analyse sessions (KV blobs, tool calls, findings) and print a report. Exit 0 = clean, 1 = any "
                 "warning or error finding, 2 = usage error."),
    "blobs": ("The KV blobs of one session: each set and get request, the blob's content and its role, and the "
              "checkpoints that refer to it."),
    "tools": ("The tool calls of one session with their arguments rebuilt four ways: as streamed, from the "
              "completion's McpArgs, the two merged, and what a naive client that concatenates every snapshot would "
              "get."),
    "diff": ("Align two sessions by their message kinds and list what differs: messages in one only, changed "
             "decoded fields, execs answered or closed differently, tool arguments, timing past a threshold, the "
             "ending, findings and the stall. Ids, hashes and wall-clock times are ignored. Exit 0 same, 1 "
             "different, 2 bad input."),
    "report": ("One HTML file, nothing fetched from the network: session facts, findings with links to their "
               "evidence frames, a sequence diagram, a timeline, tool calls, KV blobs and every frame with its "
               "decoded tree. Secrets are always redacted."),
    "schema": ("Work with protobuf schemas: `schema extract` recovers every message, enum and service that "
               "protobuf-es generated code defines; `schema use` makes one the default for decoding, `schema show` "
               "says which is active; `schema diff` compares two; `schema drift` lists what captures carry that a "
               "schema does not name."),
}

_HELP = {name: help_text for name, help_text, _ in COMMANDS}


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                **kwargs: Any) -> argparse.ArgumentParser:
    """Add the top-level command ``name`` with its help from ``COMMANDS``; ``kwargs`` go to ``add_parser``.

    A name the table lacks is a programming error: the command would be missing from
    ``workbench --help`` and unreachable, since the CLI only loads modules the table names.
    """
    if name not in _HELP:
        raise LookupError(f"command {name!r} is not in workbench.commands.table.COMMANDS")
    kwargs.setdefault("description", DESCRIPTIONS[name])
    return sub.add_parser(name, help=_HELP[name], **kwargs)
