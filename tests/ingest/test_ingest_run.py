"""``workbench run``: byte-identical passthrough, exit code, live recording readable during the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC
from pathlib import Path

import pytest
from support import wait_until

from workbench.ingest.run import redact_argv
from workbench.store import StoreError, open_reader
from workbench.store.reader import sidecar_path

DATA = Path(__file__).parent / "data"
FAKE = DATA / "fake_cursor_agent.py"
WORKBENCH = str(Path(sys.executable).with_name("workbench"))  # the installed entry point


def _run_cmd(db: Path) -> list[str]:
    return [WORKBENCH, "run", "--db", str(db), "--",
            sys.executable, str(FAKE), "-p", "--output-format", "stream-json", "--stream-partial-output",
            "--api-key", "sk-live-0123456789abcdef", "why does the test fail?"]


@pytest.mark.slow
def test_run_passthrough_and_live_recording(tmp_path: Path, ingest_sample: Path) -> None:
    db = tmp_path / "run.duckdb"
    gate = tmp_path / "gate"
    tail = "Warning: update available\r"
    env = {**os.environ, "FAKE_AGENT_GATE": str(gate), "FAKE_AGENT_GATE_AFTER": "8",
           "FAKE_AGENT_TAIL": tail, "FAKE_AGENT_EXIT": "3"}
    proc = subprocess.Popen(_run_cmd(db), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        # While the CLI is held at the gate, the first 8 lines must already be in the database,
        # read through the run's live service (the file itself is locked by the writer).
        seen, status, live_rows = 0, [], []

        def eight_lines_live() -> bool:
            nonlocal seen, status, live_rows
            if sidecar_path(db).exists():
                try:
                    reader = open_reader(db)
                    assert reader.live
                    # frames and the session row are committed one after the other: wait for both
                    seen = int(reader.query("SELECT count(*) FROM frames").column(0)[0].as_py())
                    status = reader.query("SELECT status FROM sessions").column(0).to_pylist()
                    live_rows = reader.query("SELECT kind, ts FROM frames ORDER BY seq").to_pylist()
                    reader.close()
                except StoreError:
                    seen = 0  # the service is starting or stopping
                if seen >= 8 and status:
                    return True
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return False

        wait_until(eight_lines_live, timeout=90, what="8 lines and the session row through the live service")
        assert seen == 8
        assert status == ["open"]
        assert [r["kind"] for r in live_rows][:2] == ["system.init", "user"]
        assert proc.poll() is None
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3
    assert out == ingest_sample.read_bytes() + tail.encode()  # byte for byte
    assert b"fake-agent: using cached server config" in err  # stderr passed through
    assert not sidecar_path(db).exists()

    r = open_reader(db)
    assert not r.live
    frames = r.query("SELECT * FROM frames ORDER BY seq").to_pylist()
    (s,) = r.query("SELECT * FROM sessions").to_pylist()
    r.close()
    lines = ingest_sample.read_bytes().splitlines()
    assert [f["payload"] for f in frames] == lines + [tail.encode()]
    assert frames[-1]["kind"] == "malformed"
    assert frames[-1]["error"].startswith("line 21:")
    assert [f["ts"] for f in frames] == sorted(f["ts"] for f in frames)
    assert (s["source"], s["transport"], s["status"], s["model"]) == (
        "run:ndjson", "cli_ndjson", "complete", "Claude 4.5 Sonnet")
    meta = json.loads(s["meta"])
    assert meta["exit_code"] == 3
    # frames carry arrival times, not the transcript's (older) timestamp_ms
    first_ts = frames[0]["ts"].replace(tzinfo=UTC).timestamp()
    assert first_ts >= meta["run_started_us"] / 1e6 - 1
    assert "sk-live-0123456789abcdef" not in json.dumps(meta)
    assert meta["command"][-1] == "why does the test fail?"


@pytest.mark.slow
def test_run_without_result_and_missing_command(tmp_path: Path) -> None:
    script = tmp_path / "partial.ndjson"
    script.write_text('{"type":"system","subtype":"init","session_id":"s9","model":"auto"}\n'
                      '{"type":"connection","subtype":"reconnecting","attempt":1,"session_id":"s9"}\n')
    db = tmp_path / "p.duckdb"
    env = {**os.environ, "FAKE_AGENT_SCRIPT": str(script), "FAKE_AGENT_EXIT": "1"}
    done = subprocess.run(_run_cmd(db), capture_output=True, env=env, timeout=120)
    assert done.returncode == 1
    assert done.stdout == script.read_bytes()
    r = open_reader(db)
    (s,) = r.query("SELECT status, error FROM sessions").to_pylist()
    r.close()
    assert s["status"] == "incomplete"
    assert "exited with code 1 without a result" in s["error"]

    missing = subprocess.run([WORKBENCH, "run", "--db", str(db), "--",
                              str(tmp_path / "no-such-cli")], capture_output=True, timeout=120)
    assert missing.returncode == 2
    assert b"cannot run" in missing.stderr
    assert b"no-such-cli" in missing.stderr


@pytest.mark.slow
def test_run_with_a_deeply_nested_line_goes_on(tmp_path: Path) -> None:
    """One stdout line nested 100k deep (issue 20, finding 6): the CLI runs to its end, every byte is
    passed on, the line is kept as a malformed frame with its bytes, the lines after it are recorded
    and the session ends complete."""
    deep = b'{"type": "assistant", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    lines = [b'{"type":"system","subtype":"init","session_id":"s-deep","model":"auto"}', deep,
             b'{"type":"assistant","session_id":"s-deep","message":{"content":[{"type":"text","text":"after"}]}}',
             b'{"type":"result","subtype":"success","session_id":"s-deep","result":"after"}']
    script = tmp_path / "deep.ndjson"
    script.write_bytes(b"\n".join(lines) + b"\n")
    db = tmp_path / "deep.duckdb"
    env = {**os.environ, "FAKE_AGENT_SCRIPT": str(script), "FAKE_AGENT_EXIT": "0"}
    done = subprocess.run(_run_cmd(db), capture_output=True, env=env, timeout=120)
    assert b"Traceback" not in done.stderr, done.stderr.decode()[-2000:]
    assert done.returncode == 0
    assert done.stdout == script.read_bytes()
    r = open_reader(db)
    try:
        (s,) = r.query("SELECT status, frame_count FROM sessions").to_pylist()
        frames = r.query("SELECT kind, error, payload FROM frames ORDER BY seq").to_pylist()
    finally:
        r.close()
    assert s == {"status": "complete", "frame_count": 4}
    assert [f["kind"] for f in frames] == ["system.init", "malformed", "assistant", "result.success"]
    assert frames[1]["payload"] == deep and frames[1]["error"].startswith("line 2: not JSON")


def test_redact_argv() -> None:
    argv = ["cursor-agent", "--api-key", "key_abc", "--api-key=key_def", "-H", "Authorization: Bearer tok",
            "-H", "x-trace: 1", "-p", "hello"]
    red = redact_argv(argv)
    text = " ".join(red)
    for secret in ("key_abc", "key_def", "Bearer tok"):
        assert secret not in text
    assert red[-4:] == ["-H", "x-trace: 1", "-p", "hello"]


@pytest.mark.slow
def test_run_unknown_program_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "n.duckdb"
    done = subprocess.run([WORKBENCH, "run", "--db", str(db), "--", "no-such-cursor-agent-xyz", "-p"],
                          capture_output=True, timeout=120)
    assert done.returncode == 2
    assert b"cannot run 'no-such-cursor-agent-xyz': not found on PATH" in done.stderr
    assert not db.exists()
