"""Extraction from real protobuf-es output (v1 js/ts, v2), bundled and minified by esbuild.

Each case generates code from a source schema with the npm generators, bundles it, runs
``workbench schema extract`` on the bundle, compiles the written ``.proto`` files with protoc and
compares them with the source schema field by field (numbers, names, types, labels, oneofs, maps,
enums, nested types, services).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from js_generators import SHAPE_FILES, SHAPES, Generators
from support import run_workbench

from workbench.schema.compare import facts
from workbench.schema.extract import extract
from workbench.schema.loader import BUILTIN_FILES, PROTO_ROOT, compile_protos, read_descriptor_set

# (major, protoc-gen-es target, esbuild format, esbuild target[, esbuild option]): shapes bundles take
# in the wild
SHAPES_OF_OUTPUT: list[tuple[str, ...]] = [
    ("v1", "js", "esm", "esnext"),
    # class … { static {this.typeName = …} static {this.fields = …} } (VS Code's tsconfig does this)
    ("v1", "ts", "esm", "esnext", '--tsconfig-raw={"compilerOptions":{"useDefineForClassFields":false}}'),
    ("v1", "ts", "esm", "esnext", "--keep-names"),
    ("v1", "ts", "esm", "esnext"),     # class … { static typeName = …; static fields = … }
    ("v1", "ts", "esm", "es2020"),     # lowered: __publicField(Y, "typeName", …); var alias = Y
    ("v1", "ts", "cjs", "es2019"),     # CommonJS
    ("v1", "js", "iife", "es2015"),
    ("v2", "js", "esm", "esnext"),
    ("v2", "ts", "cjs", "es2020"),
]


def _case_id(case: tuple[str, ...]) -> str:
    extra = case[4:]
    label = "static-blocks" if extra and "useDefineForClassFields" in extra[0] else extra[0].strip("-") if extra else ""
    return "-".join((*case[:4], label)).rstrip("-")


def _source_facts(root: Path, files: list[str]) -> dict[str, object]:
    return facts(compile_protos([root / f for f in files], [root]).file)


def _extracted_facts(out: Path) -> dict[str, object]:
    protos = sorted(out.rglob("*.proto"))
    assert protos, f"no .proto files written under {out}"
    return facts(compile_protos(protos, [out]).file)  # protoc must accept what we wrote


def _build(gen: Generators, tmp: Path, root: Path, files: list[str], case: tuple[str, ...]) -> Path:
    major, target, fmt, es_target, *extra = case
    sources = gen.generate(major, root, files, tmp / "gen", target)
    return gen.bundle(major, sources, tmp / "gen", tmp / "bundle.js", fmt=fmt, target=es_target, extra=tuple(extra))[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", SHAPES_OF_OUTPUT, ids=[_case_id(c) for c in SHAPES_OF_OUTPUT])
def test_overlay_round_trips(generators: Generators, tmp_path: Path, case: tuple[str, ...]) -> None:
    bundle = _build(generators, tmp_path, PROTO_ROOT, list(BUILTIN_FILES), case)
    out = tmp_path / "out"
    proc = run_workbench("schema", "extract", str(bundle), "-o", str(out), "--descriptor-set", str(tmp_path / "set.pb"))
    assert proc.returncode == 0, proc.stderr
    source = _source_facts(PROTO_ROOT, list(BUILTIN_FILES))
    assert _extracted_facts(out) == source
    assert facts(read_descriptor_set(tmp_path / "set.pb").file) == source
    report = json.loads((out / "report.json").read_text())
    assert report["problems"] == []
    assert report["counts"]["messages"] == sum(1 for v in source.values() if v["kind"] == "message")  # type: ignore[index]
    assert "agent.v1.AgentServerMessage" in report["sources"]
    assert str(bundle) in report["sources"]["agent.v1.AgentServerMessage"][0]


@pytest.mark.slow
@pytest.mark.parametrize("case", SHAPES_OF_OUTPUT, ids=[_case_id(c) for c in SHAPES_OF_OUTPUT])
def test_every_field_shape_and_packages_in_one_bundle(generators: Generators, tmp_path: Path,
                                                      case: tuple[str, ...]) -> None:
    bundle = _build(generators, tmp_path, SHAPES, SHAPE_FILES, case)
    ex = extract([bundle])
    assert [str(p) for p in ex.problems] == []
    out = tmp_path / "out"
    from workbench.schema.extract import write

    write(ex, out)
    got = _extracted_facts(out)
    want = _source_facts(SHAPES, SHAPE_FILES)
    assert got == want
    assert {k.rsplit(".", 1)[0] for k, v in got.items() if v["kind"] == "service"} == {"shapes.v1"}  # type: ignore[index]
    assert {"shapes.v1.AllShapes", "legacy.v1.Record", "other.v2.Envelope"} <= set(got)


@pytest.mark.slow
def test_many_chunks_with_renamed_exports(generators: Generators, tmp_path: Path) -> None:
    """esbuild code splitting: types live in shared chunks, referenced through import/export aliases."""
    sources = generators.generate("v1", SHAPES, SHAPE_FILES, tmp_path / "gen", "js")
    chunks = generators.bundle("v1", sources, tmp_path / "gen", tmp_path / "dist", splitting=True)
    assert len(chunks) > 3
    out = tmp_path / "out"
    proc = run_workbench("schema", "extract", str(tmp_path / "dist"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert _extracted_facts(out) == _source_facts(SHAPES, SHAPE_FILES)


@pytest.mark.slow
def test_tsc_commonjs_files_minified_one_by_one(generators: Generators, tmp_path: Path) -> None:
    """tsc output (``Y.typeName = …``, ``exports.Y``, ``require("./common_pb.js").Point``), no bundler,
    the runtime package not among the files (its well-known types are still known)."""
    sources = generators.generate("v1", SHAPES, SHAPE_FILES, tmp_path / "gen", "ts")
    files = generators.tsc_files(sources, tmp_path / "gen", tmp_path / "dist")
    assert len(files) == len(sources)
    ex = extract([tmp_path / "dist"])
    assert [str(p) for p in ex.problems] == []
    out = tmp_path / "out"
    from workbench.schema.extract import write

    write(ex, out)
    assert _extracted_facts(out) == _source_facts(SHAPES, SHAPE_FILES)


@pytest.mark.slow
def test_bundles_concatenated_in_one_file_reuse_names(generators: Generators, tmp_path: Path) -> None:
    """Three separately minified apps in one file, each in its own function scope: the minifier gave
    unrelated types the same short names in each, and every reference must still find its own."""
    parts = []
    for i, (root, files, target) in enumerate([(PROTO_ROOT, list(BUILTIN_FILES), "ts"), (SHAPES, SHAPE_FILES, "ts"),
                                               (PROTO_ROOT, list(BUILTIN_FILES), "js")]):
        sources = generators.generate("v1", root, files, tmp_path / f"gen{i}", target)
        js = generators.bundle("v1", sources, tmp_path / f"gen{i}", tmp_path / f"b{i}.js")[0].read_text()
        parts.append("(()=>{" + js[: js.rfind("export{")] + "})();\n")
    one = tmp_path / "one.js"
    one.write_text("".join(parts))
    ex = extract([one])
    assert [str(p) for p in ex.problems] == []
    want = {**_source_facts(PROTO_ROOT, list(BUILTIN_FILES)), **_source_facts(SHAPES, SHAPE_FILES)}
    assert facts(ex.files) == want
