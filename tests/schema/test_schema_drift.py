"""``workbench schema drift`` on a capture of the next build (next_build.py) read with the overlay.

The capture was recorded by mitmdump with the capture addon and no schema configured, so the overlay
decoded it: the renumbered ``TextDelta.text``, the new ``ShellArgs.sandbox_profile`` and the new
exec member 56 are unknown to it, and ``WriteArgs.file_bytes`` is binary. ``--proto`` with the
schema extracted from the next build's JavaScript names three of the four.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from next_build import CLIENT_VERSION, HEARTBEATS

TEXT7 = "AgentServerMessage.interaction_update.text_delta.7"
SANDBOX = "AgentServerMessage.exec_server_message.shell_args.22"
MEMBER56 = "AgentServerMessage.exec_server_message.56"
FILE_BYTES = "AgentServerMessage.exec_server_message.write_args.file_bytes"


def _wb(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(config)}
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, env=env)


def _drift(db: Path, config: Path, *extra: str) -> dict[str, Any]:
    proc = _wb("schema", "drift", "--db", str(db), "--json", *extra, config=config)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_drift_lists_every_path_the_overlay_does_not_name(next_recording: tuple[Path, Path], tmp_path: Path) -> None:
    db, _ = next_recording
    doc = _drift(db, tmp_path / "config")
    by_path = {p["path"]: p for p in doc["paths"]}
    assert set(by_path) == {TEXT7, SANDBOX, MEMBER56, FILE_BYTES}
    assert {p: by_path[p]["what"] for p in by_path} == {
        TEXT7: "unknown field", SANDBOX: "unknown field", MEMBER56: "unknown field", FILE_BYTES: "opaque bytes"}
    assert {p: by_path[p]["frames"] for p in by_path} == {TEXT7: 2, SANDBOX: 1, MEMBER56: 1, FILE_BYTES: 1}
    assert by_path[TEXT7]["owner"] == "agent.v1.TextDelta"
    assert by_path[MEMBER56]["numbers"] == [2, 56]
    assert by_path[SANDBOX]["example"] == '"workspace-write"'
    assert by_path[TEXT7]["example"] == '"Linting, then the logo."'
    assert json.loads(by_path[MEMBER56]["example"]) == {"1": "plan://7", "2": "ana"}
    assert by_path[FILE_BYTES]["example"].startswith('{"$hex": "89504e47')
    for p in by_path.values():
        assert p["client_versions"] == [CLIENT_VERSION]
        assert p["sessions"] == 1
        assert p["first_seen"] <= p["last_seen"]
        assert p["named_by_other"] is None  # no --proto given
    # The second text delta comes after the first: first and last seen differ in order of frames.
    assert by_path[TEXT7]["example_at"]["seq"] == 1
    assert doc["frames_total"] == doc["frames_walked"] == 6 + HEARTBEATS  # BidiRequestId + 5 + heartbeats
    assert doc["base"]["source"] == "built-in overlay"
    assert doc["recorded_with"] == [{"hash": doc["base"]["hash"], "source": "built-in overlay",
                                     "messages": doc["base"]["messages"], "sessions": 1}]


@pytest.mark.slow
def test_proto_says_whether_a_new_schema_names_each_path(next_recording: tuple[Path, Path], next_extracted: Path,
                                                        tmp_path: Path) -> None:
    db, _ = next_recording
    doc = _drift(db, tmp_path / "config", "--proto", str(next_extracted))
    named = {p["path"]: p["named_by_other"] for p in doc["paths"]}
    assert named == {
        TEXT7: {"name": "text", "type": "string", "owner": "agent.v1.TextDelta"},
        SANDBOX: {"name": "sandbox_profile", "type": "string", "owner": "agent.v1.ShellArgs"},
        MEMBER56: {"name": "plan_review_args", "type": "agent.v1.PlanReviewArgs", "owner": "agent.v1.ExecServerMessage"},
        FILE_BYTES: None,  # bytes there too: the new schema does not say what they are
    }
    assert doc["against"]["source"] == str(next_extracted.resolve())
    text = _wb("schema", "drift", "--db", str(db), "--proto", str(next_extracted), config=tmp_path / "config")
    assert text.returncode == 0, text.stderr
    assert "it names 3 of 4" in text.stdout
    assert "--proto: plan_review_args (agent.v1.PlanReviewArgs) in agent.v1.ExecServerMessage" in text.stdout


@pytest.mark.slow
def test_reading_with_the_new_schema_leaves_only_the_binary_bytes(next_recording: tuple[Path, Path],
                                                                   next_extracted: Path, tmp_path: Path) -> None:
    db, _ = next_recording
    config = tmp_path / "config"
    assert _wb("schema", "use", str(next_extracted), config=config).returncode == 0
    doc = _drift(db, config)
    assert [p["path"] for p in doc["paths"]] == [FILE_BYTES]
    assert doc["base"]["source"] == str(next_extracted.resolve())
    # --base builtin reads with the overlay again, whatever is configured
    assert len(_drift(db, config, "--base", "builtin")["paths"]) == 4


@pytest.mark.slow
def test_sampling_walks_fewer_frames_and_still_counts_numbered_kinds_exactly(next_recording: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    db, _ = next_recording
    doc = _drift(db, tmp_path / "config", "--sample", "1")
    kinds = 6  # bidi_request_id, text_delta, shell_args, write_args, exec 56, heartbeat
    assert doc["frames_walked"] == kinds < doc["frames_total"]
    by_path = {p["path"]: p for p in doc["paths"]}
    assert by_path[MEMBER56]["frames"] == 1
    assert by_path[TEXT7]["frames"] == 1  # one of the two text deltas was walked


@pytest.mark.slow
def test_bad_input_exits_2_naming_it(next_recording: tuple[Path, Path], tmp_path: Path) -> None:
    config = tmp_path / "config"
    missing = _wb("schema", "drift", "--db", str(tmp_path / "none.duckdb"), config=config)
    assert missing.returncode == 2
    assert "none.duckdb" in missing.stderr
    assert "Traceback" not in missing.stderr
    damaged = tmp_path / "damaged.duckdb"
    shutil.copyfile(next_recording[0], damaged)
    with damaged.open("r+b") as f:
        f.seek(0)
        f.write(b"\0" * 8192)
    bad = _wb("schema", "drift", "--db", str(damaged), config=config)
    assert bad.returncode == 2
    assert "damaged.duckdb" in bad.stderr
    assert "Traceback" not in bad.stderr
    no_schema = _wb("schema", "drift", "--db", str(next_recording[0]), "--proto", str(tmp_path / "nope"),
                    config=config)
    assert no_schema.returncode == 2
    assert "nope" in no_schema.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sample", ["0", "-3"])
def test_sample_must_be_positive(next_recording: tuple[Path, Path], tmp_path: Path, sample: str) -> None:
    proc = _wb("schema", "drift", "--db", str(next_recording[0]), "--sample", sample, config=tmp_path / "c")
    assert proc.returncode == 2
    assert "--sample" in proc.stderr
