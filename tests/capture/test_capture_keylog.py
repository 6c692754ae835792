"""``workbench capture --keylog``: tcpdump + the clients' TLS key logs, imported on Ctrl-C / SIGTERM.

Real processes: ``workbench sim``, ``workbench capture --keylog`` (tcpdump on lo, as root here and
in CI), the built-in client CLI with ``SSLKEYLOGFILE`` and the Node.js test client with
``NODE_OPTIONS=--tls-keylog``, both taken from the lines the capture prints.
"""

from __future__ import annotations

import json
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import packet_capture_env
import pytest
from capture_rig import BIN, NODE_CLIENT, Sim
from support import env_without_proxy, query_rows

from workbench.capture.keylog import CaptureCounter

TOKEN = "wb-keylog-token-3f9a1d"
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _packet_capture_possible() -> None:
    """Before anything of this module starts: skip (or fail in CI) without tcpdump, tshark and root."""
    packet_capture_env.need()


class KeylogCapture:
    """A running ``workbench capture --keylog``: its printed setup lines and the environment they give."""

    def __init__(self, port: int, db: Path, folder: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [str(BIN / "workbench"), "capture", "--keylog", "--interface", "lo", "--port", str(port), "--db", str(db),
             "--keylog-dir", str(folder), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("export NODE_OPTIONS="):
                break
        assert any(ln.startswith("export SSLKEYLOGFILE=") for ln in self.lines), (self.lines, self.proc.stderr.read())
        self.env = dict(ln.removeprefix("export ").split("=", 1) for ln in self.lines if ln.startswith("export "))

    @property
    def keys(self) -> Path:
        return Path(self.env["SSLKEYLOGFILE"])

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=300)
        return self.proc.returncode, out, err


def _builtin_client(sim: Sim, env: dict[str, str], prompt: str) -> None:
    e = {**env_without_proxy(), **env, "CURSOR_ACCESS_TOKEN": TOKEN}
    done = subprocess.run([str(BIN / "workbench"), "client", "--upstream", sim.url, "--ca-file", str(sim.cert), prompt],
                          capture_output=True, text=True, timeout=120, env=e)
    assert done.returncode == 0, done.stderr


def _node_client(sim: Sim, env: dict[str, str], log: Path, transport: str) -> dict[str, Any]:
    e = {**env_without_proxy(), **env}
    done = subprocess.run(["node", str(NODE_CLIENT), "--base-url", sim.url, "--ca", str(sim.cert), "--no-proxy",
                           "--transport", transport, "--prompt", "[scenario:text] hello", "--log", str(log)],
                          capture_output=True, text=True, timeout=120, env=e)
    assert done.stdout.strip(), done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(("sig", "keep"), [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_keylog_capture_records_and_imports(capture_sim: Sim, tmp_path: Path, sig: int, keep: bool) -> None:
    port = int(capture_sim.url.rsplit(":", 1)[1])
    db, folder, log = tmp_path / "keylog.duckdb", tmp_path / "cap", tmp_path / "node.ndjson"
    cap = KeylogCapture(port, db, folder, *(["--keep-keys"] if keep else []))
    assert cap.lines[0] == f"capturing on lo with tcpdump, filter: tcp port {port}"
    assert cap.env["NODE_OPTIONS"] == f"--tls-keylog={cap.keys}"
    assert cap.keys.parent == folder and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(cap.keys.stat().st_mode) == 0o600  # a secret from the start
    try:
        _builtin_client(capture_sim, {"SSLKEYLOGFILE": cap.env["SSLKEYLOGFILE"]}, "[scenario:tool_flow] go")
        summary = _node_client(capture_sim, {"NODE_OPTIONS": cap.env["NODE_OPTIONS"]}, log, "runsse")
        assert summary["turn_ended"] and summary["error"] is None, summary
        secrets = [line.split()[-1] for line in cap.keys.read_text().splitlines() if line and not line.startswith("#")]
        assert len(secrets) >= 5 * 3  # TLS 1.3: five secrets per connection, three connections at least
    finally:
        rc, out, err = cap.stop(sig)
    assert rc == 0, err
    assert out.strip().splitlines()[-1].startswith(f"imported {folder / 'packets.pcap'} → {db}: 2 sessions, "), out
    assert "workbench capture: packets " in err
    assert (folder / "packets.pcap").exists()
    assert cap.keys.exists() == keep
    if keep:
        assert stat.S_IMODE(cap.keys.stat().st_mode) == 0o600
    sessions = {r["transport"]: r for r in query_rows(db, "SELECT * FROM sessions")}
    assert set(sessions) == {"run", "runsse"}
    assert all(s["source"] == "import:pcap" and s["status"] == "complete" for s in sessions.values()), \
        [(s["transport"], s["status"], s["error"]) for s in sessions.values()]
    rows = query_rows(db, "SELECT direction, transport, payload FROM frames WHERE session_id = ? ORDER BY seq",
              [sessions["runsse"]["session_id"]])
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    for direction in ("client", "server"):
        assert [bytes(r["payload"]).hex() for r in rows if r["direction"] == direction] == \
            [e["hex"] for e in logged if e["direction"] == direction]
    # the key log never reaches the database, in any form
    raw = db.read_bytes()
    for secret in secrets:
        assert secret.encode() not in raw and bytes.fromhex(secret) not in raw


def test_without_capture_privilege(capture_sim: Sim, tmp_path: Path) -> None:
    packet_capture_env.need("setpriv")  # util-linux: drops CAP_NET_RAW
    port = int(capture_sim.url.rsplit(":", 1)[1])
    drop = "-net_raw,-net_admin"  # from the inheritable set too: some container runtimes fill it
    cmd = ["setpriv", "--inh-caps", drop, "--bounding-set", drop, str(BIN / "workbench"), "capture", "--keylog",
           "--interface", "lo", "--port", str(port), "--db", str(tmp_path / "x.duckdb"), "--keylog-dir",
           str(tmp_path / "cap")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env_without_proxy())
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("workbench capture: tcpdump may not capture on lo: it needs root or the "
                                  "CAP_NET_RAW and CAP_NET_ADMIN capabilities;"), done.stderr
    assert "setcap cap_net_raw,cap_net_admin=eip" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "cap" / "keys.log").exists()


def test_without_tools(tmp_path: Path) -> None:
    only_tshark = tmp_path / "bin"
    only_tshark.mkdir()
    (only_tshark / "tshark").symlink_to(shutil.which("tshark") or "/usr/bin/tshark")
    base = [str(BIN / "workbench"), "capture", "--keylog", "--db", str(tmp_path / "x.duckdb")]
    done = subprocess.run(base, capture_output=True, text=True, timeout=60, env={"PATH": str(only_tshark)})
    assert done.returncode == 2
    assert done.stderr.strip() == ("workbench capture: packet capture needs tcpdump or dumpcap, and neither is "
                                   "installed: sudo apt-get install tcpdump (dumpcap comes with tshark, which the "
                                   "import needs anyway)")
    done = subprocess.run(base, capture_output=True, text=True, timeout=60, env={"PATH": str(tmp_path / "none")})
    assert done.returncode == 2
    assert done.stderr.strip() == ("workbench capture: tshark not found: install the tshark package (Debian/Ubuntu: "
                                   "sudo apt-get install tshark) (workbench capture --keylog decodes with it)")


def test_counter_counts_what_tshark_reads(capture_sim: Sim, tmp_path: Path) -> None:
    """The live counter reads record headers of pcap and pcapng files, also while they are cut mid-record."""
    port = int(capture_sim.url.rsplit(":", 1)[1])
    cap = KeylogCapture(port, tmp_path / "c.duckdb", tmp_path / "cap", "--keep-keys")
    try:
        _builtin_client(capture_sim, {"SSLKEYLOGFILE": cap.env["SSLKEYLOGFILE"]}, "[scenario:text] hi")
    finally:
        rc, _out, err = cap.stop()
    assert rc == 0, err
    pcap = tmp_path / "cap" / "packets.pcap"
    pcapng = tmp_path / "packets.pcapng"
    subprocess.run(["editcap", "-F", "pcapng", str(pcap), str(pcapng)], check=True, capture_output=True)
    for f in (pcap, pcapng):
        lens = subprocess.run(["tshark", "-r", str(f), "-T", "fields", "-e", "frame.len"], capture_output=True,
                              text=True, check=True).stdout.split()
        counter = CaptureCounter(f)
        counter.poll()
        assert (counter.packets, counter.bytes) == (len(lens), sum(int(n) for n in lens)), f
        half = tmp_path / f"half{f.suffix}"
        half.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        partial = CaptureCounter(half)
        partial.poll()
        assert 0 < partial.packets < counter.packets
        with half.open("ab") as fh:  # the writer goes on: the counter picks up where it stopped
            fh.write(f.read_bytes()[f.stat().st_size // 2:])
        partial.poll()
        assert (partial.packets, partial.bytes) == (counter.packets, counter.bytes)


def test_dumpcap_when_chosen(capture_sim: Sim, tmp_path: Path) -> None:
    """dumpcap (it comes with tshark) records pcapng; the import reads it the same way."""
    packet_capture_env.need("dumpcap")  # it comes with tshark
    port = int(capture_sim.url.rsplit(":", 1)[1])
    db = tmp_path / "d.duckdb"
    cap = KeylogCapture(port, db, tmp_path / "cap", "--capture-tool", "dumpcap")
    assert cap.lines[0] == f"capturing on lo with dumpcap, filter: tcp port {port}"
    try:
        _builtin_client(capture_sim, {"SSLKEYLOGFILE": cap.env["SSLKEYLOGFILE"]}, "[scenario:text] hi")
    finally:
        rc, out, err = cap.stop()
    assert rc == 0, err
    assert out.strip().splitlines()[-1].startswith(f"imported {tmp_path / 'cap' / 'packets.pcapng'} → {db}: 1 session, ")
    (s,) = query_rows(db, "SELECT source, status, json_extract_string(meta, '$.format') AS fmt FROM sessions")
    assert s == {"source": "import:pcap", "status": "complete", "fmt": "pcapng"}
    assert not cap.keys.exists()


def test_tool_that_dies_mid_capture_is_an_error_and_its_packets_are_kept(capture_sim: Sim, tmp_path: Path) -> None:
    """tcpdump killed under the capture (OOM killer, interface gone): exit 2 naming it, after importing
    what it wrote; never a quiet "nothing to import" with exit 0."""
    port = int(capture_sim.url.rsplit(":", 1)[1])
    db, folder = tmp_path / "died.duckdb", tmp_path / "cap"
    cap = KeylogCapture(port, db, folder)
    try:
        _builtin_client(capture_sim, {"SSLKEYLOGFILE": cap.env["SSLKEYLOGFILE"]}, "[scenario:text] hi")
        tool = subprocess.run(["pgrep", "-P", str(cap.proc.pid), "-x", "tcpdump"], capture_output=True, text=True)
        assert tool.stdout.strip(), "no tcpdump under the capture"
        _quiet(folder / "packets.pcap")  # the client's last packets are on disk before tcpdump dies
        subprocess.run(["kill", "-KILL", tool.stdout.split()[0]], check=True)
        out, err = cap.proc.communicate(timeout=300)
    finally:
        if cap.proc.poll() is None:
            cap.stop()
    assert cap.proc.returncode == 2, (out, err)
    assert "workbench capture: tcpdump stopped by itself (exit -9)" in err and "packets it wrote were imported" in err
    assert "Traceback" not in err
    sessions = query_rows(db, "SELECT transport, status FROM sessions")
    assert sessions == [{"transport": "run", "status": "complete"}], sessions
    assert not (folder / "keys.log").exists()  # the secret is still deleted


def _quiet(pcap: Path, quiet_s: float = 1.0) -> None:
    """Wait until the capture file has packets and has not grown for ``quiet_s``."""
    counter, last, since = CaptureCounter(pcap), -1, time.monotonic()
    deadline = since + 60
    while time.monotonic() < deadline:
        counter.poll()
        if counter.packets != last:
            last, since = counter.packets, time.monotonic()
        elif last > 0 and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)
    raise AssertionError(f"{pcap}: still {last} packets, never quiet")


def test_import_that_fails_keeps_the_key_log_and_says_where(capture_sim: Sim, tmp_path: Path) -> None:
    """Another process holds the database when the capture stops: the import fails (exit 2), and the key
    log stays, named with the command that imports later; that command then imports the packets."""
    from workbench.store.db import Store

    port = int(capture_sim.url.rsplit(":", 1)[1])
    db, folder = tmp_path / "held.duckdb", tmp_path / "cap"
    Store(str(db)).close()
    holder = subprocess.Popen(
        [str(BIN / "python"), "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
         "print('holding', flush=True); sys.stdin.read()", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        cap = KeylogCapture(port, db, folder)
        try:
            _builtin_client(capture_sim, {"SSLKEYLOGFILE": cap.env["SSLKEYLOGFILE"]}, "[scenario:text] hi")
        finally:
            rc, _out, err = cap.stop()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert rc == 2, err
    assert "Traceback" not in err
    assert cap.keys.exists() and stat.S_IMODE(cap.keys.stat().st_mode) == 0o600
    pcap = folder / "packets.pcap"
    later = f"workbench import {pcap} --keylog {cap.keys} --db {db}"
    assert f"the key log is kept at {cap.keys}" in err and later in err, err
    done = subprocess.run([str(BIN / "workbench"), *later.split()[1:]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert query_rows(db, "SELECT transport, status FROM sessions") == [{"transport": "run", "status": "complete"}]


def test_existing_keylog_dir_is_never_changed(tmp_path: Path) -> None:
    """--keylog-dir naming a folder that exists (mode 0755, shared): it keeps its mode; the capture's
    files go to a new private folder inside it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    (shared / "theirs.txt").write_text("x")
    cap = KeylogCapture(1, tmp_path / "e.duckdb", shared)
    try:
        inner = cap.keys.parent
        assert inner.parent == shared and inner.name.startswith("keylog-"), cap.lines
        assert stat.S_IMODE(inner.stat().st_mode) == 0o700
        assert f"packets: {inner / 'packets.pcap'}" in cap.lines
    finally:
        rc, _out, err = cap.stop()
    assert rc == 0, err
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert (shared / "theirs.txt").read_text() == "x"


def test_keylog_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    not_dir = tmp_path / "file"
    not_dir.write_text("mine")
    done = subprocess.run([str(BIN / "workbench"), "capture", "--keylog", "--interface", "lo", "--db",
                           str(tmp_path / "f.duckdb"), "--keylog-dir", str(not_dir)],
                          capture_output=True, text=True, timeout=60, env=env_without_proxy())
    assert done.returncode == 2
    assert done.stderr.strip() == f"workbench capture: --keylog-dir {not_dir}: exists and is not a folder"
    assert not_dir.read_text() == "mine"
