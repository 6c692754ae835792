"""``workbench schema diff A B``: exactly the changes between two real schemas; exit 0 / 1 / 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.schema.diff import diff
from workbench.schema.loader import BUILTIN_FILES, PROTO_ROOT, compile_protos

NEXT_CHANGES = [
    {"change": "oneof_member_added", "type": "agent.v1.ExecServerMessage", "field": "plan_review_args",
     "number": 56, "a": None, "b": "agent.v1.PlanReviewArgs (oneof args)"},
    {"change": "message_added", "type": "agent.v1.PlanReviewArgs", "a": None, "b": "2 fields"},
    {"change": "field_added", "type": "agent.v1.ShellArgs", "field": "sandbox_profile", "number": 22, "a": None,
     "b": "string"},
    {"change": "field_renamed", "type": "agent.v1.ShellArgs", "field": "cwd", "number": 2,
     "a": "working_directory", "b": "cwd"},
    {"change": "field_renumbered", "type": "agent.v1.TextDelta", "field": "text", "number": 7, "a": 1, "b": 7},
]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench.cli", "schema", "diff", *args],
                          capture_output=True, text=True)


def _json(*args: str) -> tuple[int, dict[str, Any]]:
    proc = _cli(*args, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
def test_overlay_against_the_next_build_lists_exactly_its_changes(next_proto: Path) -> None:
    code, doc = _json("builtin", str(next_proto))
    assert code == 1
    assert doc["changes"] == NEXT_CHANGES
    assert doc["same"] is False
    assert doc["counts"] == {"field_added": 1, "field_renamed": 1, "field_renumbered": 1, "message_added": 1,
                             "oneof_member_added": 1}
    assert doc["b"]["messages"] == doc["a"]["messages"] + 1
    text = _cli("builtin", str(next_proto))
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert "~ agent.v1.TextDelta" in lines
    assert "    ~ field text renumbered: 1 → 7" in lines
    assert "    + oneof member 56 plan_review_args: agent.v1.PlanReviewArgs (oneof args)" in lines
    assert lines[-1].startswith("5 changes:")


@pytest.mark.slow
def test_reversed_order_reverses_each_change(next_proto: Path) -> None:
    _, doc = _json(str(next_proto), "builtin")
    kinds = {(c["change"], c["type"], c.get("field")) for c in doc["changes"]}
    assert kinds == {("oneof_member_removed", "agent.v1.ExecServerMessage", "plan_review_args"),
                     ("message_removed", "agent.v1.PlanReviewArgs", None),
                     ("field_removed", "agent.v1.ShellArgs", "sandbox_profile"),
                     ("field_renamed", "agent.v1.ShellArgs", "working_directory"),
                     ("field_renumbered", "agent.v1.TextDelta", "text")}


@pytest.mark.slow
def test_the_same_schema_in_three_forms_is_the_same(next_proto: Path, next_extracted: Path, tmp_path: Path) -> None:
    fds = compile_protos([next_proto / f for f in BUILTIN_FILES], [next_proto])
    desc = tmp_path / "next.pb"
    desc.write_bytes(fds.SerializeToString())
    for a, b in ((str(next_proto), str(desc)), (str(next_proto), str(next_extracted))):
        proc = _cli(a, b)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "same: no message, field, enum or service differs" in proc.stdout
    assert _json("builtin", str(PROTO_ROOT))[0] == 0


@pytest.mark.slow
def test_types_labels_oneofs_enums_and_services(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x.proto").write_text('syntax = "proto3"; package x.v1;\n'
                               "enum Mode { MODE_UNSPECIFIED = 0; MODE_FAST = 1; MODE_OLD = 2; }\n"
                               "message M { int32 n = 1; repeated string tags = 2; oneof pick { string s = 3; } "
                               "map<string, int32> counts = 4; }\n"
                               "service S { rpc Go(M) returns (M); }\n")
    (b / "x.proto").write_text('syntax = "proto3"; package x.v1;\n'
                               "enum Mode { MODE_UNSPECIFIED = 0; MODE_QUICK = 1; MODE_NEW = 3; }\n"
                               "message M { int64 n = 1; string tags = 2; string s = 3; "
                               "map<string, string> counts = 4; }\n"
                               "service S { rpc Go(M) returns (stream M); rpc Stop(M) returns (M); }\n")
    got = [(c.change, c.field, c.a, c.b) for c in diff(compile_protos([a / "x.proto"], [a]).file,
                                                       compile_protos([b / "x.proto"], [b]).file)]
    assert got == [  # by type name: x.v1.M, x.v1.Mode, x.v1.S
        ("field_type_changed", "n", "int32", "int64"),
        ("field_label_changed", "tags", "repeated", "singular"),
        ("field_oneof_changed", "s", "pick", None),
        ("field_type_changed", "counts", "map<string, int32>", "map<string, string>"),
        ("enum_value_renamed", "MODE_QUICK", "MODE_FAST", "MODE_QUICK"),
        ("enum_value_removed", "MODE_OLD", 2, None),
        ("enum_value_added", "MODE_NEW", None, 3),
        ("method_changed", "Go", "(x.v1.M) returns (x.v1.M)", "(x.v1.M) returns (stream x.v1.M)"),
        ("method_added", "Stop", None, "(x.v1.M) returns (x.v1.M)"),
    ]


@pytest.mark.slow
def test_bad_input_exits_2_naming_it(tmp_path: Path) -> None:
    missing = _cli("builtin", str(tmp_path / "gone"))
    assert missing.returncode == 2
    assert "gone" in missing.stderr
    broken = tmp_path / "broken"
    shutil.copytree(PROTO_ROOT, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "agent/v1/agent.proto").write_text("syntax = 'proto3'; message {")
    bad = _cli(str(broken), "builtin")
    assert bad.returncode == 2
    assert "agent.proto" in bad.stderr
    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\xff\xff\xff not a descriptor set")
    unparsable = _cli(str(junk), "builtin")
    assert unparsable.returncode == 2
    assert "junk.pb" in unparsable.stderr
    for proc in (missing, bad, unparsable):
        assert "Traceback" not in proc.stderr
