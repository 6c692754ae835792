"""Benchmark: `workbench schema extract` on a 50 MB minified bundle (target ≤ 10 s).

The bundle is built like a real app bundle: a synthetic Cursor-sized schema (3,000 messages in
four packages, with enums, maps, oneofs, optional and repeated fields and cross-references) is
generated with the real protobuf-es v1 TypeScript target (Cursor's shape), bundled and minified by
esbuild, and surrounded by real minified library code (esbuild-minified TypeScript compiler, each
copy in its own scope) up to 50 MB. Prints the extraction time, throughput, and the ratio to
reading the file once (the baseline measured in the same run).

Needs node and npm (the generators are installed into the user's cache, as the tests do).
Run: .venv/bin/python benchmarks/schema_extract.py [--mb 50] [--messages 3000] [--apps 2]
     .venv/bin/python benchmarks/schema_extract.py --one-line [--mb 100]
(``--one-line``: a bundle of one line, the test shapes' v1 bundle (TypeScript target, minified)
repeated in scopes of its own up to ``--mb``, extracted by ``workbench schema extract`` in a process
of its own: time, CPU time and peak RSS, against reading the file once; issue 35's case.)
(``--apps 2``: two separately minified schema apps, so short names are reused across scopes and the
extractor also builds its block index of the bundle.)
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from goals import goal
from yardstick import measure

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "schema"))

from js_generators import SHAPE_FILES, SHAPES, Generators, install  # noqa: E402

from workbench.schema.extract import extract  # noqa: E402

_SCALARS = ["string", "int32", "int64", "bool", "bytes", "double", "uint32", "sint64", "fixed32", "float"]


def synthetic_schema(root: Path, messages: int, seed: int = 7, app: str = "") -> list[str]:
    """``app`` renames the packages (``agent<app>.v1``…): another app's schema, minified on its own."""
    rnd = random.Random(seed)
    packages = [f"{p}{app}.v1" for p in ("agent", "aiserver", "anyrun", "internapi")]
    shares = [0.22, 0.72, 0.04, 0.02]
    names: list[tuple[str, str]] = []
    for pkg, share in zip(packages, shares, strict=True):
        names += [(pkg, f"{pkg.split('.')[0].capitalize()}Msg{i}") for i in range(int(messages * share))]
    files = []
    for pkg in packages:
        mine = [n for p, n in names if p == pkg]
        lines = ['syntax = "proto3";', f"package {pkg};", 'import "google/protobuf/struct.proto";']
        lines += [f"enum {pkg.split('.')[0].capitalize()}Kind {{"] + \
                 [f"  {pkg.split('.')[0].upper()}_KIND_{j} = {j};" for j in range(6)] + ["}"]
        for i, name in enumerate(mine):
            lines.append(f"message {name} {{")
            n = 1
            for _ in range(rnd.randint(2, 14)):
                r = rnd.random()
                if r < 0.25 and i > 0:
                    lines.append(f"  {rnd.choice(['', 'repeated '])}{rnd.choice(mine[:i])} ref_{n} = {n};")
                elif r < 0.32:
                    lines.append(f"  map<string, {rnd.choice(_SCALARS[:4])}> map_{n} = {n};")
                elif r < 0.37:
                    lines.append(f"  {pkg.split('.')[0].capitalize()}Kind kind_{n} = {n};")
                elif r < 0.42:
                    lines.append(f"  optional {rnd.choice(_SCALARS)} maybe_{n} = {n};")
                elif r < 0.45:
                    lines.append(f"  google.protobuf.Value json_{n} = {n};")
                else:
                    lines.append(f"  {rnd.choice(['', 'repeated '])}{rnd.choice(_SCALARS)} field_{n} = {n};")
                n += 1
            if rnd.random() < 0.3:
                lines.append("  oneof choice {")
                for _ in range(rnd.randint(2, 5)):
                    lines.append(f"    {rnd.choice(_SCALARS)} opt_{n} = {n};")
                    n += 1
                lines.append("  }")
            lines.append("}")
        path = f"{pkg.replace('.', '/')}/{pkg.split('.')[0]}.proto"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("\n".join(lines) + "\n")
        files.append(path)
    return files


def build_bundle(gen: Generators, work: Path, mb: int, messages: int, apps: int = 1) -> Path:
    """Filler scopes around ``apps`` schema apps, each bundled and minified on its own (so they bind the
    same short names to different types, and the extractor has to tell their scopes apart)."""
    schema_parts: list[str] = []
    for k in range(apps):
        app = str(k + 1) if k else ""
        proto_root = work / f"proto{app}"
        files = synthetic_schema(proto_root, messages // apps, seed=7 + k, app=app)
        sources = gen.generate("v1", proto_root, files, work / f"gen{app}", "ts")
        js = gen.bundle("v1", sources, work / f"gen{app}", work / f"schema{app}.js")[0].read_text()
        schema_parts.append(f"(()=>{{{_strip_exports(js)}}})();\n")
    schema_js = "".join(schema_parts)
    esbuild = gen.prefix("v1") / "node_modules" / ".bin" / "esbuild"
    ts_lib = gen.prefix("v1") / "node_modules" / "typescript" / "lib" / "typescript.js"
    filler = subprocess.run([str(esbuild), str(ts_lib), "--minify", "--log-level=error"], capture_output=True,
                            text=True, check=True).stdout
    parts: list[str] = []
    size = len(schema_js)
    while size < mb * 1_000_000:
        chunk = f"(()=>{{{filler}}})();\n"
        parts.append(chunk)
        size += len(chunk)
    step = max(1, len(parts) // (apps + 1))
    text = ""
    for k, part in enumerate(schema_parts):
        text += "".join(parts[k * step:(k + 1) * step]) + part
    text += "".join(parts[apps * step:])
    out = work / "app.bundle.js"
    out.write_text(text)
    return out


def _strip_exports(js: str) -> str:
    """The ESM bundle as a script body (a real app bundle has no module-level exports)."""
    cut = js.rfind("export{")
    return js[:cut] if cut >= 0 else js


def one_line_bundle(gen: Generators, work: Path, mb: int) -> Path:
    """The shapes' v1 bundle on one line, repeated (each copy in its own scope) up to ``mb`` MB."""
    sources = gen.generate("v1", SHAPES, SHAPE_FILES, work / "gen", "ts")
    small = _strip_exports(gen.bundle("v1", sources, work / "gen", work / "small.js")[0].read_text())
    chunk = "(()=>{" + small.replace("\n", " ") + "})();"
    out = work / "one-line.js"
    with out.open("w") as fh:
        for _ in range(mb * 1_000_000 // len(chunk) + 1):
            fh.write(chunk)
    return out


def one_line(gen: Generators, mb: int) -> None:
    with tempfile.TemporaryDirectory(prefix="wb-schema-bench-") as tmp:
        bundle = one_line_bundle(gen, Path(tmp), mb)
        size = bundle.stat().st_size
        t0 = time.perf_counter()
        bundle.read_bytes()
        read_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "workbench", "schema", "extract", str(bundle), "-o",
                                 str(Path(tmp) / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"schema extract failed: {proc.stderr.read().decode()[-400:] if proc.stderr else ''}")
    rss = usage.ru_maxrss / 1024
    print(f"one-line bundle: {size / 1e6:.1f} MB; read once (baseline) {read_s:.3f} s")
    print(f"extract: {took:.2f} s wall, {usage.ru_utime + usage.ru_stime:.2f} s CPU ({size / 1e6 / took:.1f} MB/s), "
          f"peak RSS {rss:,.0f} MiB ({rss * 1048576 / size:.1f}× the input); load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--apps", type=int, default=1,
                    help="separately minified schema apps in the bundle (2+: short names reused across scopes)")
    ap.add_argument("--one-line", action="store_true",
                    help="a one-line bundle of a small real bundle repeated (time, CPU, peak RSS)")
    args = ap.parse_args()
    gen = Generators(install("v1"), install("v2"))
    print(measure().line())
    if args.one_line:
        one_line(gen, args.mb if args.mb != 50 else 100)
        return
    with tempfile.TemporaryDirectory(prefix="wb-schema-bench-") as tmp:
        bundle = build_bundle(gen, Path(tmp), args.mb, args.messages, args.apps)
        size = bundle.stat().st_size
        t0 = time.perf_counter()
        data = bundle.read_bytes()
        read_s = time.perf_counter() - t0
        del data
        t0 = time.perf_counter()
        ex = extract([bundle])
        extract_s = time.perf_counter() - t0
        counts = ex.counts()
    mb = size / 1e6
    print(f"bundle: {mb:.1f} MB, recovered {counts['messages']} messages, {counts['enums']} enums, "
          f"{counts['fields']} fields, {len(ex.problems)} problems")
    print(f"read once (baseline): {read_s:.3f} s ({mb / read_s:.0f} MB/s)")
    print(f"extract: {extract_s:.2f} s ({mb / extract_s:.1f} MB/s); ratio to reading once: {extract_s / read_s:.0f}x; "
          f"{goal('schema_extract').line(extract_s)}")


if __name__ == "__main__":
    main()
