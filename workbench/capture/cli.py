"""``workbench capture``: run mitmdump with the capture addon and tell the user how to use it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from types import FrameType
from typing import Any

from workbench.commands.common import add_db_arg, add_proto_arg
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.protocol.routes import DEFAULT_HOSTS, DEFAULT_PATHS

ENTRY = Path(__file__).with_name("mitm_entry.py")
EXIT_FRAMES_LOST = 3  # = workbench.capture.addon.EXIT_FRAMES_LOST (kept here: the CLI imports no mitmproxy)
CA_NAME = "mitmproxy-ca-cert.pem"
CLI_CONFIG_HINT = '"network": {"useHttp1ForAgent": true}'


def register(sub: Any) -> None:
    p = add_command(sub, "capture")
    add_db_arg(p)
    p.add_argument("--port", type=int, default=None,
                   help="listen port (0 = a free port; default 8080); with --keylog: the server port to "
                        "record (default 443)")
    k = p.add_argument_group("capture without a proxy (TLS key log + packet capture)")
    k.add_argument("--keylog", nargs="?", const=True, default=None, metavar="FILE",
                   help="record packets and the client's TLS keys instead of proxying; FILE: a key log the "
                        "client already writes (default: a new one in the capture folder)")
    k.add_argument("--interface", default="any", metavar="IF", help="interface to capture on (default any)")
    k.add_argument("--filter", default=None, metavar="BPF", help="capture filter (default: tcp port PORT)")
    k.add_argument("--keylog-dir", default=None, metavar="DIR",
                   help="capture folder (default: keylog-<time> next to the database)")
    k.add_argument("--keep-keys", action="store_true", help="keep the key log after the import (it is a secret)")
    k.add_argument("--capture-tool", choices=["tcpdump", "dumpcap"], default=None,
                   help="packet capture program (default: tcpdump, else dumpcap)")
    p.add_argument("--listen-host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--mode", action="append", default=[], metavar="SPEC",
                   help="mitmproxy mode: regular (default), reverse:URL, transparent, upstream:URL (repeatable)")
    p.add_argument("--bridge", action="append", default=[], metavar="URL",
                   help="an OpenAI-compatible bridge (http://HOST:PORT) to record both sides of: a reverse "
                        "listener in front of it for the OpenAI client, printed as 'bridge: URL' (give the client "
                        "that base URL; paths reach the bridge unchanged), beside the forward proxy the bridge "
                        "uses for Cursor (repeatable; docs/bridge.md)")
    p.add_argument("--redact", choices=["secrets", "content"], default="secrets",
                   help="secrets (default; credentials are always hidden) or content (also prompts, files, output)")
    p.add_argument("--flush-ms", type=int, default=250, help="commit at most this often (default 250 ms)")
    p.add_argument("--hosts", default=",".join(DEFAULT_HOSTS),
                   help="host globs on which every Connect/gRPC RPC is recorded (comma-separated)")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                   help="path globs recorded on any host (comma-separated)")
    p.add_argument("--confdir", default="~/.mitmproxy", help="mitmproxy configuration/CA directory")
    p.add_argument("--no-live", action="store_true", help="do not serve live readers while capturing")
    p.add_argument("--otlp", metavar="URL", nargs="?", const="", default=None,
                   help="send each session as an OpenTelemetry GenAI trace to this OTLP/HTTP endpoint once it "
                        "ended and was analysed (without URL: OTEL_EXPORTER_OTLP_*); a backend that is down is "
                        "retried, never fatal (docs/otel.md)")
    p.add_argument("--otlp-header", action="append", default=[], metavar="K=V",
                   help="an HTTP header for the --otlp backend (repeatable)")
    p.add_argument("--mitmdump", default=None, help="mitmdump executable (default: next to python, then PATH)")
    add_proto_arg(p)
    p.add_argument("mitmdump_args", nargs="*", metavar="-- MITMDUMP_ARGS", help="passed to mitmdump unchanged")
    p.set_defaults(func=cmd_capture)


def find_mitmdump(explicit: str | None = None) -> str:
    if explicit:
        if not (Path(explicit).is_file() or shutil.which(explicit)):
            raise CliError(f"--mitmdump {explicit}: no such executable")
        return explicit
    beside = Path(sys.executable).with_name("mitmdump")
    if beside.is_file():
        return str(beside)
    found = shutil.which("mitmdump")
    if not found:
        raise CliError("mitmdump not found next to this Python or on PATH (pip install -e . here installs it: mitmproxy 11.0.2 on Python 3.11, 12.x on 3.12+)")
    return found


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait_listening(proc: subprocess.Popen[bytes], host: str, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CliError(f"mitmdump exited with status {proc.returncode} before listening on port {port} "
                           "(see its messages above)")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise CliError(f"mitmdump did not start listening on {host}:{port} within {timeout:.0f} s")


def _url_and_hints(args: argparse.Namespace, host: str, port: int, ca: Path) -> list[str]:
    modes = args.mode or ["regular"]
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    first = modes[0]
    if first.startswith("reverse:"):
        target = first.split(":", 1)[1]
        scheme = "https" if target.startswith(("https", "http2")) else "http"
        url = f"{scheme}://{hostport}"
        # Clients that never use a proxy for local or private addresses take the capture's own
        # URL as their API base URL instead.
        env = [f"base url: {url}  (reverse proxy to {target}: give clients this as their API base URL)",
               f"export CURSOR_API_ENDPOINT={url}"]
    elif first.startswith("transparent") or first.startswith(("wireguard", "local")):
        url = f"http://{hostport}"
        env = [f"# {first} mode: redirect traffic to port {port} (iptables/nftables); no proxy variables needed"]
    else:
        url = f"http://{hostport}"
        env = [f"export HTTPS_PROXY={url}"]
    env.append(f"export NODE_EXTRA_CA_CERTS={ca}")
    env.append(f"# cursor-agent over HTTP/1.1 (RunSSE + BidiAppend): in ~/.cursor/cli-config.json set {CLI_CONFIG_HINT}")
    return [url, f"ca: {ca}", *env]


def _bridge_listeners(urls: list[str], host: str) -> list[tuple[str, int]]:
    """(bridge URL, listen port) per ``--bridge``: each gets a reverse listener on a free port.

    The listener speaks plain HTTP to the OpenAI client (mitmproxy's reverse mode detects TLS from
    the client's first bytes, so an http:// base URL works) and the bridge's own scheme upstream."""
    out: list[tuple[str, int]] = []
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CliError(f"--bridge {url}: give the bridge's base URL, http://HOST:PORT (or https://)")
        if parts.path not in ("", "/") or parts.query:
            raise CliError(f"--bridge {url}: give the bridge's origin only (http://HOST:PORT); "
                           "the client's paths (/v1/chat/completions) go to the bridge unchanged")
        try:
            parts.port  # noqa: B018  (raises on a port that is not a number)
        except ValueError as exc:
            raise CliError(f"--bridge {url}: {exc}") from exc
        out.append((f"{parts.scheme}://{parts.netloc}", free_port(host)))
    return out


def _read_stats(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _counter(stats: dict[str, Any]) -> str:
    line = (f"sessions {stats.get('sessions', 0)} ({stats.get('open', 0)} open) · "
            f"frames {stats.get('frames', 0):,} ({stats.get('committed', 0):,} committed)")
    if not stats.get("db_ok", True):
        if stats.get("spool"):
            line += f" · DATABASE UNAVAILABLE, spooling to {stats.get('spool')}"
        else:
            line += f" · DATABASE AND SPOOL UNAVAILABLE, {stats.get('held', 0):,} frames held in memory"
    if stats.get("lost"):
        line += f" · {stats['lost']:,} FRAMES LOST"
    return line


def cmd_capture(args: argparse.Namespace) -> int:
    if args.keylog:
        # keylog capture (tshark, the importers) loads only for --keylog
        from workbench.capture.keylog import cmd_capture_keylog

        return cmd_capture_keylog(args)
    if args.port is None:
        args.port = 8080
    mitmdump = find_mitmdump(args.mitmdump)
    if args.flush_ms <= 0:
        raise CliError(f"--flush-ms {args.flush_ms}: must be a positive number of milliseconds")
    host = args.listen_host
    port = free_port(host) if args.port == 0 else args.port
    confdir = Path(os.path.expanduser(args.confdir))
    for extra in args.mitmdump_args:  # a confdir given to mitmdump decides where the CA lives
        if extra.startswith("confdir="):
            confdir = Path(os.path.expanduser(extra.split("=", 1)[1]))
    db = str(Path(args.db).expanduser())
    # DuckDB loads only once the arguments are valid
    from workbench.store.db import check_readable

    check_readable(db)  # a damaged file: exit 2 naming it, not a capture that can only spool
    # the schema (protobuf) loads only once the arguments are valid
    from workbench.schema.active import active_schema, schema_option

    schema = active_schema(args.proto)  # a schema that cannot be used: exit 2 before mitmdump starts
    print(f"workbench capture: decoding with {schema.identity.source} ({schema.identity.messages} messages, "
          f"hash {schema.identity.hash})", file=sys.stderr, flush=True)
    statsdir = tempfile.mkdtemp(prefix="workbench-capture-")
    stats_path = Path(statsdir) / "stats.json"
    cmd = [mitmdump, "-s", str(ENTRY), "--listen-host", host, "--listen-port", str(port),
           "--set", f"confdir={confdir}", "--set", f"cursor_db={db}", "--set", f"cursor_redact={args.redact}",
           "--set", f"cursor_flush_ms={args.flush_ms}", "--set", f"cursor_hosts={args.hosts}",
           "--set", f"cursor_paths={args.paths}", "--set", f"cursor_stats_file={stats_path}",
           "--set", f"cursor_live={'false' if args.no_live else 'true'}", "--set", "flow_detail=0",
           "--set", f"cursor_schema={schema_option(args.proto)}"]
    bridges = _bridge_listeners(args.bridge, host)
    modes = list(args.mode)
    if bridges and not modes:
        modes = ["regular"]  # --mode given with --bridge adds the reverse listeners to it
    for mode in modes + [f"reverse:{target}@{bport}" for target, bport in bridges]:
        cmd += ["--mode", mode]
    cmd += args.mitmdump_args
    # mitmdump's own output goes to stderr: stdout carries the URL and the setup lines only.
    shipper = _otlp_shipper(args, db)
    proc = subprocess.Popen(cmd, stdout=sys.stderr.fileno(), start_new_session=True)
    stopping = {"signal": 0, "count": 0}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping["signal"] = signum
        stopping["count"] += 1
        if proc.poll() is None:
            # First: mitmdump's clean shutdown (the addon commits in `done`); asking again escalates.
            escalate = {1: signal.SIGINT, 2: signal.SIGTERM}
            proc.send_signal(escalate.get(stopping["count"], signal.SIGKILL))

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _wait_listening(proc, host, port)
        for _target, bport in bridges:
            _wait_listening(proc, host, bport)
        ca = confdir / CA_NAME
        deadline = time.monotonic() + 10
        while not ca.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        for line in _url_and_hints(args, host, port, ca):
            print(line, flush=True)
        if shipper is not None:
            shipper.start()
            print(f"# sessions go to {shipper.sender.endpoint or 'the OTEL_EXPORTER_OTLP_* endpoint'} as traces "
                  "when they end", flush=True)
        for target, bport in bridges:
            hostport = f"[{host}]:{bport}" if ":" in host else f"{host}:{bport}"
            print(f"bridge: http://{hostport}", flush=True)
            print(f"# OpenAI client → http://{hostport} → bridge {target}; the bridge's Cursor traffic: "
                  f"HTTPS_PROXY above", flush=True)
        _watch(proc, stats_path, stopping)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stats = _read_stats(stats_path)
        if stats is not None:
            print(f"\nworkbench capture: {_counter(stats)} → {db}", file=sys.stderr, flush=True)
        if shipper is not None:
            shipper.stop()
        shutil.rmtree(statsdir, ignore_errors=True)
    lost = int((stats or {}).get("lost") or 0)
    if lost or proc.returncode == EXIT_FRAMES_LOST:
        print(f"workbench capture: ERROR: {lost:,} frames were lost (database and spool unavailable); "
              f"exit status {EXIT_FRAMES_LOST}", file=sys.stderr, flush=True)
        return EXIT_FRAMES_LOST
    if stopping["signal"]:
        return 0 if proc.returncode in (0, -signal.SIGINT, 130) else int(proc.returncode or 1)
    return int(proc.returncode or 0)


def _otlp_shipper(args: argparse.Namespace, db: str) -> Any:
    if args.otlp is None:
        if args.otlp_header:
            raise CliError("--otlp-header goes with --otlp")
        return None
    # the OpenTelemetry SDK loads only for --otlp
    from workbench.export.cli import parse_headers
    from workbench.otel.sender import OtlpError
    from workbench.otel.shipper import OtlpShipper

    try:
        return OtlpShipper(db, args.otlp or None, parse_headers(args.otlp_header, "--otlp-header"))
    except OtlpError as exc:
        raise CliError(str(exc)) from exc


def _watch(proc: subprocess.Popen[bytes], stats_path: Path, stopping: dict[str, int]) -> None:
    tty = sys.stderr.isatty()
    last_line = ""
    last_print = 0.0
    while True:
        try:
            proc.wait(0.5)
            return
        except subprocess.TimeoutExpired:
            pass
        stats = _read_stats(stats_path)
        if stats is None:
            continue
        line = _counter(stats)
        now = time.monotonic()
        if tty:
            if line != last_line:
                sys.stderr.write("\r\x1b[2K" + line)
                sys.stderr.flush()
        elif line != last_line and now - last_print >= 10:
            print(line, file=sys.stderr, flush=True)
            last_print = now
        last_line = line
