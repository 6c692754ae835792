"""Bad input to ``workbench schema extract``: a clear message with file and offset, nothing lost."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from js_generators import SHAPE_FILES, SHAPES, Generators
from support import run_workbench

from workbench.schema.extract import extract

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def test_file_without_protobuf_es_code_exits_2(tmp_path: Path) -> None:
    js = tmp_path / "plain.js"
    js.write_text('export function add(a,b){return a+b}const typeName="not.a.Message";console.log(add(1,2));\n')
    proc = run_workbench("schema", "extract", str(js), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "plain.js" in proc.stderr
    assert "no protobuf-es code" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert run_workbench("schema", "extract", str(tmp_path / "missing.js")).returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_workbench("schema", "extract", str(empty))
    assert proc.returncode == 2
    assert "no .js" in proc.stderr


def test_truncated_v1_bundle_keeps_what_came_before(generators: Generators, tmp_path: Path) -> None:
    sources = generators.generate("v1", SHAPES, SHAPE_FILES, tmp_path / "gen", "js")
    bundle = generators.bundle("v1", sources, tmp_path / "gen", tmp_path / "app.js")[0]
    data = bundle.read_bytes()
    anchor = data.index(b'"shapes.v1.AllShapes"')
    cut = tmp_path / "cut.js"
    cut.write_bytes(data[: anchor + 400])  # ends inside AllShapes' field list
    whole = extract([bundle])
    proc = run_workbench("schema", "extract", str(cut), "-o", str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    problems = [p for p in report["problems"] if p["file"] == str(cut) and p["offset"] is not None]
    assert problems, report["problems"]
    assert any("input ends" in p["problem"] or "unterminated" in p["problem"] for p in problems)
    assert all(0 <= p["offset"] <= len(data) for p in problems)
    # what was defined before the cut is still written
    assert 0 < report["counts"]["messages"] < whole.counts()["messages"]
    assert (tmp_path / "out" / "report.json").exists()


def test_broken_and_cut_v2_descriptors_are_named(generators: Generators, tmp_path: Path) -> None:
    sources = generators.generate("v2", SHAPES, SHAPE_FILES, tmp_path / "gen", "js")
    bundle = generators.bundle("v2", sources, tmp_path / "gen", tmp_path / "app.js")[0]
    text = bundle.read_text()
    name = b"legacy/v1/legacy.proto"
    head = base64.b64encode(b"\x0a" + bytes((len(name),)) + name).decode()[:12]
    start = text.index('"' + head)  # the embedded FileDescriptorProto of legacy.proto
    end = text.index('"', start + 1)
    body = text[start + 1:end]
    broken = text[:start + 1] + body[:40] + "////" + body[44:] + text[end:]
    (tmp_path / "broken.js").write_text(broken)
    ex = extract([tmp_path / "broken.js"])
    msgs = [str(p) for p in ex.problems]
    assert any("legacy/v1/legacy.proto" in m and f"offset {start}" in m and "does not parse" in m for m in msgs), msgs
    assert {"shapes.v1.AllShapes", "other.v2.Envelope"} <= {n for f in ex.files for n in
                                                            [f.package + "." + m.name for m in f.message_type]}
    (tmp_path / "cut.js").write_text(text[: start + 30])
    ex = extract([tmp_path / "cut.js"])
    assert any("cut off" in str(p) and f"offset {start}" in str(p) for p in ex.problems), [str(p) for p in ex.problems]
