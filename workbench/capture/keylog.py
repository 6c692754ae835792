"""``workbench capture --keylog``: record packets and TLS session keys, then import them.

No proxy in the middle: the client keeps talking to its real server, writes its TLS session keys
to a key-log file (``SSLKEYLOGFILE`` for Electron/Chromium and Python, ``NODE_OPTIONS=--tls-keylog``
for Node), and tcpdump (or dumpcap) records the packets. On Ctrl-C or SIGTERM the capture is
imported like ``workbench import PCAP --keylog KEYS`` (``workbench.ingest.pcap``).

Files live in a new capture folder (mode 0700; inside ``--keylog-dir`` when that folder exists
already, which is never changed): ``packets.pcap`` (``packets.pcapng`` from dumpcap)
and ``keys.log``. The key log is a secret — anyone holding it and the packets reads the traffic —
so it is created with mode 0600, read only by tshark, never copied into the database, and deleted
after the import unless ``--keep-keys``; an import that fails keeps it, and says where. A key log
the user named (``--keylog FILE``) is theirs and is left where it is.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from workbench.errors import CliError

PRIVILEGE_HINT = {
    "tcpdump": "run it as root (sudo), or give tcpdump the capability once: "
               "sudo setcap cap_net_raw,cap_net_admin=eip $(command -v tcpdump)",
    "dumpcap": "run it as root (sudo), or allow non-root capture: sudo dpkg-reconfigure wireshark-common "
               "(answer yes) and sudo usermod -a -G wireshark $USER, then log in again",
}
TOOLS_HINT = ("packet capture needs tcpdump or dumpcap, and neither is installed: "
              "sudo apt-get install tcpdump (dumpcap comes with tshark, which the import needs anyway)")
DRAIN_QUIET_S = 0.6   # on stop: packets still arriving are waited for until the capture is this quiet…
DRAIN_MAX_S = 3.0     # …but not longer than this
EXIT_UNDECRYPTABLE = 1
BUFFER_KIB = 32 * 1024  # kernel capture buffer


@dataclass
class Tool:
    name: str
    path: str


def find_tool(prefer: str | None = None) -> Tool:
    names = [prefer] if prefer else ["tcpdump", "dumpcap"]
    for name in names:
        found = shutil.which(name)
        if found:
            return Tool(Path(name).name, found)
    if prefer:
        raise CliError(f"--capture-tool {prefer}: not found on PATH")
    raise CliError(TOOLS_HINT)


def _stamp() -> str:
    return time.strftime("keylog-%Y%m%d-%H%M%S")


def _new_private_dir(parent: Path, stem: str) -> Path:
    """A folder created here and now with mode 0700, never one that was already there."""
    for n in range(1, 100):
        folder = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        folder.chmod(0o700)  # ours, just made: whatever the umask said
        return folder
    raise FileExistsError(f"{parent / stem}: 99 folders of that name are there already")


def make_folder(named: Path | None, db: str) -> Path:
    """The capture folder: a new one of mode 0700.

    A folder that already exists (``--keylog-dir`` naming the user's own folder) is never changed:
    its mode may be what its owner wants, and making it private would break whoever shares it. The
    capture then makes a new private ``keylog-<time>`` folder inside it instead.
    """
    if named is None:
        where = Path(db).expanduser().resolve().parent
        try:
            return _new_private_dir(where, _stamp())
        except OSError as exc:
            raise CliError(f"{where}: cannot create the capture folder next to the database "
                           f"(--keylog-dir picks another place): {exc.strerror or exc}") from exc
    try:
        named.parent.mkdir(parents=True, exist_ok=True)
        named.mkdir(mode=0o700)
        named.chmod(0o700)
        return named
    except FileExistsError:
        if not named.is_dir():
            raise CliError(f"--keylog-dir {named}: exists and is not a folder") from None
    except OSError as exc:
        raise CliError(f"--keylog-dir {named}: cannot create the capture folder: {exc.strerror or exc}") from exc
    try:
        return _new_private_dir(named, _stamp())
    except OSError as exc:
        raise CliError(f"--keylog-dir {named}: cannot create a capture folder inside it: "
                       f"{exc.strerror or exc}") from exc


def create_keylog(path: Path) -> Path:
    """An empty key-log file only its owner can read (clients append to it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise CliError(f"{path}: a key log of an earlier capture is there; pick another --keylog-dir") from exc
    except OSError as exc:
        raise CliError(f"{path}: cannot create the key log: {exc.strerror or exc}") from exc
    os.close(fd)
    os.chmod(path, 0o600)  # whatever the umask said
    return path


class CaptureCounter:
    """Packets and bytes in a capture file that is still being written (pcap or pcapng).

    Reads only the record headers the file format defines, incrementally: what the live counter
    shows while tcpdump or dumpcap writes.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.packets = 0
        self.bytes = 0
        self._pos = 0
        self._endian = "<"
        self._kind: str | None = None

    def poll(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._pos)
                data = fh.read()
        except OSError:
            return
        pos = 0
        if self._kind is None:
            if len(data) < 24:
                return
            magic = data[:4]
            if magic == b"\x0a\x0d\x0d\x0a":
                self._kind = "pcapng"
                self._endian = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
            else:
                self._kind = "pcap"
                self._endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
                pos = 24
        e = self._endian
        while True:
            if self._kind == "pcap":
                if len(data) - pos < 16:
                    break
                incl, orig = struct.unpack_from(e + "II", data, pos + 8)
                if len(data) - pos < 16 + incl:
                    break
                self.packets += 1
                self.bytes += orig
                pos += 16 + incl
            else:
                if len(data) - pos < 12:
                    break
                btype, blen = struct.unpack_from(e + "II", data, pos)
                if blen < 12 or len(data) - pos < blen:
                    break
                if btype == 6 and blen >= 28:      # enhanced packet block: original length at +24
                    self.packets += 1
                    self.bytes += struct.unpack_from(e + "I", data, pos + 24)[0]
                elif btype == 3 and blen >= 16:    # simple packet block
                    self.packets += 1
                    self.bytes += struct.unpack_from(e + "I", data, pos + 8)[0]
                pos += blen
        self._pos += pos

    def line(self) -> str:
        return f"packets {self.packets:,} · {self.bytes / 1e6:,.2f} MB"


def _tool_command(tool: Tool, interface: str, bpf: str, out: Path) -> list[str]:
    if tool.name == "dumpcap":  # hands packets over at least every 250 ms (less than the drain's quiet time)
        return [tool.path, "-q", "-i", interface, "-B", str(BUFFER_KIB // 1024), "-f", bpf, "-w", str(out)]
    # --immediate-mode: each packet is handed over as it arrives (libpcap otherwise holds them for up to a
    # second), so the counter is live and a stop loses nothing; -U writes each one out at once. In that
    # mode every packet takes a slot as large as the biggest packet (64 KiB on lo), so the kernel buffer
    # is made large enough for bursts while tcpdump waits for a CPU (-B, in KiB).
    cmd = [tool.path, "-i", interface, "--immediate-mode", "-B", str(BUFFER_KIB), "-U", "-n", "-s", "0",
           "-w", str(out)]
    if os.geteuid() == 0:
        cmd += ["-Z", "root"]  # keep the file ours: tcpdump would hand it to its own user
    return [*cmd, bpf]


def _read_stderr(proc: subprocess.Popen[bytes], lines: list[str], ready: threading.Event,
                 ended: threading.Event) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.decode("utf-8", "replace").rstrip()
        if len(lines) < 200:
            lines.append(line)
        if "listening on" in line or line.startswith("Capturing on"):
            ready.set()
    ended.set()
    ready.set()


class PacketCapture:
    """tcpdump or dumpcap writing ``out`` until ``stop()``."""

    def __init__(self, tool: Tool, interface: str, bpf: str, out: Path) -> None:
        self.tool, self.interface, self.bpf, self.out = tool, interface, bpf, out
        self.messages: list[str] = []
        self.counter = CaptureCounter(out)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        ready, ended = threading.Event(), threading.Event()
        self.proc = subprocess.Popen(_tool_command(self.tool, self.interface, self.bpf, self.out),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        threading.Thread(target=_read_stderr, args=(self.proc, self.messages, ready, ended), daemon=True).start()
        ready.wait(timeout)
        if ended.is_set():
            # Its stderr closed: the tool is exiting. The kernel closes a process's files before it
            # can be reaped, so poll() alone may still say "running" here (seen on a loaded machine).
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        # dumpcap says "Capturing on" before it knows it may; give a refusal its moment to arrive
        if self.proc.poll() is None and self.tool.name == "dumpcap":
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.5)
        if self.proc.poll() is not None:
            raise CliError(self.failure())

    def failure(self) -> str:
        """Why the tool stopped by itself, in words a user can act on."""
        text = " ".join(m for m in self.messages if m)
        if "permission" in text.lower() or "not permitted" in text.lower():
            return (f"{self.tool.name} may not capture on {self.interface}: it needs root or the "
                    f"CAP_NET_RAW and CAP_NET_ADMIN capabilities; {PRIVILEGE_HINT[self.tool.name]}")
        detail = next((m for m in self.messages if m and "listening on" not in m), "no message")
        return f"{self.tool.name} stopped by itself (exit {self.proc.returncode if self.proc else '?'}): {detail}"

    def dropped(self) -> int:
        """Packets the kernel dropped, as the tool reports at its end (tcpdump and dumpcap alike)."""
        for m in self.messages:
            low = m.lower()
            if "dropped by kernel" in low or low.startswith("packets dropped"):
                digits = "".join(ch for ch in m.split("dropped")[0] if ch.isdigit()) or \
                    "".join(ch for ch in m.split(":")[-1] if ch.isdigit())
                return int(digits or 0)
        return 0

    def stop(self) -> None:
        """Let packets still in flight land, then stop the tool so it closes the file cleanly."""
        if self.proc is None:
            return
        deadline = time.monotonic() + DRAIN_MAX_S
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline and self.proc.poll() is None:
            self.counter.poll()
            if self.counter.packets != last:
                last, quiet_since = self.counter.packets, time.monotonic()
            elif time.monotonic() - quiet_since >= DRAIN_QUIET_S:
                break
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.counter.poll()


def setup_lines(tool: Tool, interface: str, bpf: str, pcap: Path, keys: Path, keep: bool, own_keys: bool) -> list[str]:
    fate = "yours, left in place" if not own_keys else ("kept after the import (--keep-keys)" if keep
                                                          else "deleted after the import; --keep-keys keeps it")
    return [
        f"capturing on {interface} with {tool.name}, filter: {bpf}",
        f"packets: {pcap}",
        f"key log: {keys} (mode 0600, a secret: {fate})",
        f"export SSLKEYLOGFILE={keys}",
        f"export NODE_OPTIONS=--tls-keylog={keys}",
        "# start the client from this environment (cursor-agent, or the IDE from this shell); "
        "Ctrl-C here stops and imports",
    ]


def _watch(capture: PacketCapture, stopping: threading.Event) -> None:
    tty = sys.stderr.isatty()
    last_line, last_print = "", time.monotonic()
    while not stopping.wait(0.5):
        if capture.proc is not None and capture.proc.poll() is not None:
            return
        capture.counter.poll()
        line = capture.counter.line()
        now = time.monotonic()
        if tty and line != last_line:
            sys.stderr.write("\r\x1b[2K" + line)
            sys.stderr.flush()
        elif not tty and line != last_line and now - last_print >= 10:
            print(line, file=sys.stderr, flush=True)
            last_print = now
        last_line = line
    if tty:
        sys.stderr.write("\r\x1b[2K")


def cmd_capture_keylog(args: argparse.Namespace) -> int:
    """Capture until Ctrl-C or SIGTERM, then import; exit 1 when a connection could not be decrypted."""
    # the importers load only when a keylog capture starts
    from workbench.ingest.tshark import TsharkMissing, find_tshark

    try:
        find_tshark()  # needed for the import at the end: say so before anything is recorded
    except TsharkMissing as exc:
        raise CliError(f"{exc} (workbench capture --keylog decodes with it)") from exc
    if args.mode or args.mitmdump_args:
        raise CliError("--mode and mitmdump arguments belong to the proxy capture; --keylog records packets instead")
    port = args.port if args.port is not None else 443
    if not 0 < port < 65536:
        raise CliError(f"--port {port}: with --keylog, the server port to record (1-65535; default 443)")
    tool = find_tool(args.capture_tool)
    bpf = args.filter or f"tcp port {port}"
    db = str(Path(args.db).expanduser())
    # DuckDB loads only when a keylog capture starts
    from workbench.store.db import check_readable

    check_readable(db)
    folder = make_folder(Path(args.keylog_dir).expanduser() if args.keylog_dir else None, db)
    pcap = folder / ("packets.pcapng" if tool.name == "dumpcap" else "packets.pcap")
    own_keys = not isinstance(args.keylog, str)
    keys = create_keylog(folder / "keys.log") if own_keys else Path(args.keylog).expanduser()
    capture = PacketCapture(tool, args.interface, bpf, pcap)
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            capture.start()
        except CliError:
            if own_keys:
                keys.unlink(missing_ok=True)
            raise
        for line in setup_lines(tool, args.interface, bpf, pcap, keys, args.keep_keys, own_keys):
            print(line, flush=True)
        _watch(capture, stopping)
    finally:
        capture.stop()
        for s, h in old.items():
            signal.signal(s, h)
    print(f"workbench capture: {capture.counter.line()} → {pcap}", file=sys.stderr, flush=True)
    dropped = capture.dropped()
    if dropped:
        print(f"workbench capture: WARNING: {capture.tool.name} says {dropped:,} packets were dropped by the kernel: "
              f"exchanges they belonged to are incomplete (a larger buffer helps: -B for tcpdump)",
              file=sys.stderr, flush=True)
    imported = False
    try:
        rc = _import(db, pcap, keys, port, capture)
        imported = True
    except BaseException:
        # The packets are useless without the key log: an import that did not finish (a reader holding
        # the database, a full disk, a second Ctrl-C) must leave both for a later import.
        if own_keys and not args.keep_keys and keys.exists() and capture.counter.packets:
            print(f"workbench capture: the import did not complete; the key log is kept at {keys} (mode 0600, "
                  f"a secret: delete it once imported). Import later with: workbench import {pcap} "
                  f"--keylog {keys} --db {db}", file=sys.stderr, flush=True)
        raise
    finally:
        if own_keys and not args.keep_keys and (imported or not capture.counter.packets):
            keys.unlink(missing_ok=True)
    if capture.proc is not None and capture.proc.returncode not in (0, -signal.SIGINT, 130):
        # what it wrote is imported, but the capture did not run until asked to stop
        raise CliError(f"{capture.failure()}; the {capture.counter.packets:,} packets it wrote were imported")
    return rc


def _import(db: str, pcap: Path, keys: Path, port: int, capture: PacketCapture) -> int:
    # the importers load only when a keylog capture starts
    from workbench.ingest import IngestError, Progress, import_file, open_store

    failed = capture.proc is not None and capture.proc.returncode not in (0, -signal.SIGINT, 130)
    if failed and capture.counter.packets == 0:
        raise CliError(capture.failure())  # it stopped on its own before recording anything
    if not keys.exists() or keys.stat().st_size == 0:
        print(f"workbench capture: no client wrote keys to {keys}: was it started with SSLKEYLOGFILE or "
              f"NODE_OPTIONS=--tls-keylog from the lines above?", file=sys.stderr, flush=True)
    if capture.counter.packets == 0:
        print(f"workbench capture: no packets matched {capture.bpf} on {capture.interface}; nothing to import",
              file=sys.stderr, flush=True)
        return 0
    store = open_store(db)
    try:
        progress = Progress(str(pcap), stream=sys.stderr)

        def warn(msg: str) -> None:
            progress.finish()
            print(f"workbench capture: {msg}", file=sys.stderr, flush=True)

        try:
            result = import_file(pcap, store, "pcap", progress=progress, warn=warn,
                                 options={"keylog": keys if keys.exists() else None, "tls_ports": (port,)})
        except IngestError as exc:
            raise CliError(f"{exc} (the packets stay in {pcap})") from exc
    finally:
        store.close()
    print(result.summary_line().replace(str(pcap), f"{pcap} → {db}", 1), flush=True)
    return EXIT_UNDECRYPTABLE if result.undecryptable else 0
