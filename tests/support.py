"""Helpers every test folder shares: wait for a condition, run or start ``workbench`` (or any
command) as a real process, find a free port, read a capture database's rows.

Importable as ``support`` from any test module (``tests/conftest.py`` is the rootdir conftest, so
pytest puts ``tests/`` on ``sys.path``). Waiting is on conditions, never a fixed sleep: each helper
polls a condition until it holds and fails with a message that says what it was waiting for (and,
for a process, what it printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# The command line as a user runs it: ``python -m workbench`` (the same ``main`` as the console
# script, without depending on the venv's bin/ being on PATH).
WORKBENCH = [sys.executable, "-m", "workbench"]
BIN = Path(sys.executable).parent
MITMDUMP = BIN / "mitmdump"
STARTUP_TIMEOUT = 60.0
PROXY_VARIABLES = ("https_proxy", "http_proxy", "all_proxy")

What = str | Callable[[], object]


def _describe(what: What, condition: object) -> str:
    text = what() if callable(what) else what
    return str(text or condition)


def wait_until(condition: Callable[[], T], *, timeout: float = 60.0, interval: float = 0.05,
               what: What = "", proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None) -> T:
    """Poll ``condition`` until it returns something truthy and return that.

    ``what`` (text, or a function giving it) names the condition in the failure message. With
    ``proc``, a process that exits before the condition holds fails at once instead of timing out.
    """
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited with {proc.returncode} while waiting for "
                                 f"{_describe(what, condition)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {_describe(what, condition)}")
        time.sleep(interval)


async def wait_until_async(condition: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.01,
                           what: What = "", pause: Callable[[], Awaitable[object]] | None = None) -> T:
    """``wait_until`` for a test running on an event loop: the loop keeps running while it waits.

    ``pause`` replaces the sleep between checks (e.g. a Textual pilot's ``pause``).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = condition()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {_describe(what, condition)}")
        if pause is not None:
            await pause()
        await asyncio.sleep(interval)


CI_VARIABLE = "WORKBENCH_CI"


def ci_run(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the slowest matrices run as CI runs them (``.ci/run`` sets ``WORKBENCH_CI=1``; CI
    services set ``CI``): the analysis matrix's healthy cells and the hostile properties' examples
    are sampled on a developer's run (README command 2) and run in full here."""
    env = os.environ if environ is None else environ
    return any(env.get(name, "").strip().lower() not in ("", "0", "false", "no") for name in (CI_VARIABLE, "CI"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for programs without ``--port 0``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_socket() -> socket.socket:
    """A listening TCP socket on 127.0.0.1, inheritable, for a child given its descriptor: unlike a
    ``free_port`` number, nothing else can take the port between choosing it and the child serving it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    s.set_inheritable(True)
    return s


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(port: int, proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None,
              timeout: float = 90.0) -> None:
    """Wait until something accepts connections on ``port`` (failing early if ``proc`` exits)."""
    wait_until(lambda: port_open(port), timeout=timeout, what=f"a listener on port {port}", proc=proc)


def env_without_proxy(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without proxy variables (tests talk to loopback servers), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES}
    env.update(extra or {})
    return env


@contextlib.contextmanager
def proxied_environ(**values: str) -> Iterator[None]:
    """Within the block, this process's own clients see no proxy or no-proxy variables but
    ``values`` (say ``HTTPS_PROXY`` and ``SSL_CERT_FILE``); the environment is restored after."""
    names = {k for k in os.environ if k.lower() in (*PROXY_VARIABLES, "no_proxy")} | set(values)
    saved = {k: os.environ.get(k) for k in names}
    for k in names:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_workbench(*args: str, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                  input: str | None = None, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    """Run ``workbench ARGS`` to completion; stdout/stderr captured as text, stdin empty unless ``input``."""
    return subprocess.run([*WORKBENCH, *args], cwd=cwd, env=dict(env) if env is not None else None,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


class Process:
    """A running command whose stdout and stderr lines are collected by reader threads.

    ``next_line()`` takes stdout lines in order (``url``/``cert`` of a server are read that way),
    ``next_line(stream="err")`` stderr lines; ``out`` and ``err`` hold every line so far; ``stop()``
    sends a signal and waits, killing the process if it does not exit.
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, pass_fds: Sequence[int] = ()) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=cwd, pass_fds=tuple(pass_fds),
                                     env=dict(env) if env is not None else env_without_proxy())
        self.out: list[str] = []
        self.err: list[str] = []
        self._lines: dict[str, queue.Queue[str | None]] = {"out": queue.Queue(), "err": queue.Queue()}
        self._readers = [threading.Thread(target=self._pump, args=(self.proc.stdout, self.out, self._lines["out"]),
                                          daemon=True),
                         threading.Thread(target=self._pump, args=(self.proc.stderr, self.err, self._lines["err"]),
                                          daemon=True)]
        for t in self._readers:
            t.start()
        self.url = ""
        self.cert: str | None = None

    @staticmethod
    def _pump(stream: object, sink: list[str], lines: queue.Queue[str | None]) -> None:
        assert stream is not None
        for line in stream:  # type: ignore[attr-defined]
            line = line.rstrip("\n")
            sink.append(line)
            lines.put(line)
        lines.put(None)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def stderr_tail(self, chars: int = 2000) -> str:
        return "\n".join(self.err)[-chars:]

    def next_line(self, timeout: float = STARTUP_TIMEOUT, stream: str = "out") -> str:
        """The next line of stdout (``stream="err"``: stderr); fails naming the command when it
        exits or stays silent."""
        lines = self._lines[stream]
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.argv[2:] or self.argv} printed nothing for {timeout:g} s; "
                                 f"stderr: {self.stderr_tail()}") from None
        if line is None:
            lines.put(None)
            rc = self.proc.wait(timeout=30)
            for t in self._readers:
                t.join(timeout=5)
            raise AssertionError(f"{self.argv[2:] or self.argv} exited with {rc}; stderr: {self.stderr_tail()}")
        return line

    def wait_for(self, condition: Callable[[], T], timeout: float = 60.0, what: What = "") -> T:
        """``wait_until`` that fails early, with the process's output, if the process exits."""
        try:
            return wait_until(condition, timeout=timeout, what=what, proc=self.proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; stdout={self.out[-20:]} stderr={self.stderr_tail()}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for t in self._readers:
            t.join(timeout=5)
        return self.proc.returncode


def start_process(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  cwd: str | Path | None = None, pass_fds: Sequence[int] = ()) -> Process:
    return Process(argv, env=env, cwd=cwd, pass_fds=pass_fds)


P = TypeVar("P", bound=Process)


def start_workbench(*args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                    cls: type[P] = Process) -> P:  # type: ignore[assignment]
    """``workbench ARGS`` as a running process (proxy variables removed, ``env`` added)."""
    return cls([*WORKBENCH, *args], env=env_without_proxy(env), cwd=cwd)


def start_server(*args: str, want_cert: bool = False, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, timeout: float = STARTUP_TIMEOUT,
                 cls: type[P] = Process) -> P:  # type: ignore[assignment]
    """A ``workbench`` server (``sim``, ``proxy``, ``replay`` with ``--port 0``): its first line is
    its URL (``.url``); with ``want_cert`` the second is ``cert: PATH`` (``.cert``)."""
    p = start_workbench(*args, env=env, cwd=cwd, cls=cls)
    try:
        p.url = p.next_line(timeout).strip()
        if want_cert:
            line = p.next_line(timeout)
            if not line.startswith("cert:"):
                raise AssertionError(f"workbench {args[0]}: expected 'cert: PATH' as the second line, got {line!r}")
            p.cert = line.split(":", 1)[1].strip()
    except BaseException:
        p.stop(signal.SIGKILL)
        raise
    return p


class SimProcess(Process):
    """``workbench sim`` as a process; each finished run is one summary line on stderr."""

    def next_run(self, timeout: float = 120.0) -> str:
        """The summary line of the next run the sim finishes."""
        while True:
            line = self.next_line(timeout, stream="err")
            if line.startswith("run "):
                return line


def start_sim(tmp: Path, *extra: str, scenarios: dict[str, Any] | None = None) -> SimProcess:
    """``workbench sim --port 0`` with fast heartbeats and, if given, a folder of extra scenarios."""
    args = ["sim", "--port", "0", "--heartbeat-interval", "0.05", "--cert-dir", str(tmp / "sim-cert"), *extra]
    if scenarios:
        folder = tmp / "scenarios"
        folder.mkdir(exist_ok=True)
        for name, doc in scenarios.items():
            (folder / f"{name}.json").write_text(json.dumps(doc), encoding="utf-8")
        args += ["--scenario-dir", str(folder)]
    return start_server(*args, want_cert=True, cls=SimProcess)


class ProcessGroup:
    """Processes started for one test (or module); all stopped when the group closes."""

    def __init__(self) -> None:
        self.started: list[Process] = []

    def add(self, p: Process) -> Process:
        self.started.append(p)
        return p

    def start(self, argv: Sequence[str], **kw: object) -> Process:
        return self.add(Process(argv, **kw))  # type: ignore[arg-type]

    def workbench(self, *args: str, **kw: object) -> Process:
        return self.add(start_workbench(*args, **kw))  # type: ignore[arg-type]

    def server(self, *args: str, **kw: object) -> Process:
        return self.add(start_server(*args, **kw))  # type: ignore[arg-type]

    def close(self) -> None:
        for p in reversed(self.started):
            p.stop()
        self.started.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def process_group() -> Iterator[ProcessGroup]:
    """Body of the ``processes`` fixture (tests/conftest.py)."""
    with ProcessGroup() as group:
        yield group


def query_rows(db: str | Path, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """The rows of ``sql`` over the capture database ``db`` as dicts, through the store's reader
    (read-only, closed after)."""
    from workbench.store import open_reader

    r = open_reader(db)
    try:
        return r.query(sql, list(params) if params is not None else None).to_pylist()
    finally:
        r.close()


def session_row(db: str | Path, session_id: str, columns: str = "*", *, meta: bool = False) -> dict[str, Any]:
    """The one ``sessions`` row of ``session_id`` (``columns`` of it); with ``meta`` its JSON
    ``meta`` parsed (``{}`` when empty). Fails naming the database and session when there is none."""
    rows = query_rows(db, f"SELECT {columns} FROM sessions WHERE session_id = ?", [session_id])
    assert len(rows) == 1, f"{db}: {len(rows)} sessions with id {session_id!r}"
    row = rows[0]
    if meta:
        row["meta"] = json.loads(row["meta"]) if row.get("meta") else {}
    return row


def stop_popen(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
    """Stop a process a test started with ``subprocess.Popen``: ``sig``, then a kill if it has not
    exited within ``timeout`` seconds; its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module (the benchmarks folder is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while being defined
    spec.loader.exec_module(mod)
    return mod


def report_examples(terminalreporter: Any, ran: Mapping[str, int], planned: Mapping[str, int]) -> None:
    """The hostile suite's "examples run" section (tests/hostile/conftest.py, or the root conftest
    with the workers' counts under pytest-xdist); also written as JSON to ``$WORKBENCH_HYPOTHESIS_REPORT``."""
    if not ran:
        return
    terminalreporter.section("hostile properties: examples run")
    report = {}
    for name in sorted(ran):
        report[name] = {"planned": planned.get(name), "ran": ran[name]}
        terminalreporter.write_line(f"{name}: {ran[name]} examples (max_examples {planned.get(name)})")
    path = os.environ.get("WORKBENCH_HYPOTHESIS_REPORT")
    if path:
        Path(path).write_text(json.dumps(report, indent=2), encoding="utf-8")


# Runs one command with stdout/stderr in temporary files (never in the measuring process's memory),
# optionally under an address-space limit, and prints its exit code, output and peak RSS as JSON:
# the wrapper's only child is the command, so RUSAGE_CHILDREN is the command's own peak.
_MEASURE = (
    "import json, resource, subprocess, sys, tempfile\n"
    "limit = int(sys.argv[1])\n"
    "def cap():\n"
    "    if limit:\n"
    "        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:\n"
    "    try:\n"
    "        rc = subprocess.run(sys.argv[3:], stdout=out, stderr=err, preexec_fn=cap,\n"
    "                            timeout=float(sys.argv[2])).returncode\n"
    "    except subprocess.TimeoutExpired:\n"
    "        rc = 'timeout'\n"
    "    out_bytes = out.tell()\n"
    "    out.seek(0)\n"
    "    lines = sum(chunk.count(b'\\n') for chunk in iter(lambda: out.read(1 << 20), b''))\n"
    "    out.seek(0)\n"
    "    err.seek(0)\n"
    "    print(json.dumps({'rc': rc, 'rss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,\n"
    "                      'out': out.read(1 << 20).decode(errors='replace'), 'out_lines': lines,\n"
    "                      'out_bytes': out_bytes,\n"
    "                      'err': err.read()[-8000:].decode(errors='replace')}))\n"
)


def run_measured(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 300.0,
                 address_space: int = 0) -> dict[str, Any]:
    """Run ``argv`` in a fresh wrapper process and return ``{"rc", "rss_kib", "out", "err",
    "out_lines", "out_bytes"}`` (``out``: the first MiB of stdout, ``err``: the last 8000 bytes):
    ``rss_kib`` is the command's peak resident set (``getrusage(RUSAGE_CHILDREN).ru_maxrss``).
    ``address_space`` (bytes, 0 = none) caps the command so that a runaway inflation fails
    inside it instead of taking memory from the machine; ``rc`` is ``"timeout"`` when it ran
    past ``timeout`` seconds (and was killed)."""
    r = subprocess.run([sys.executable, "-c", _MEASURE, str(address_space), str(timeout), *argv],
                       env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=timeout + 60)
    if r.returncode != 0:
        raise AssertionError(f"measuring {list(argv)} failed: {r.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(r.stdout)
    return result


def demo_sessions(db: Path | str) -> dict[str, str]:
    """A recorded demo database's sessions: demo scenario name → session id."""
    rows = query_rows(db, "SELECT session_id, json_extract_string(meta, '$.demo_scenario') AS sc FROM sessions")
    return {r["sc"]: r["session_id"] for r in rows}
