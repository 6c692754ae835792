"""The real protobuf-es generators from npm, installed once per version set into the user's cache.

``Generators.generate`` runs ``protoc-gen-es`` (and connect-es for v1 services) as protoc plugins
through grpcio-tools' protoc; ``bundle`` bundles and minifies the output with esbuild (which also
compiles the TypeScript target). Pinned versions (see /work/shared/DESIGN.md for why these).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SHAPES = Path(__file__).parent / "data" / "shapes"
SHAPE_FILES = ["shapes/v1/common.proto", "shapes/v1/shapes.proto", "legacy/v1/legacy.proto", "other/v2/other.proto"]
ESBUILD = "esbuild@0.28.2"
PACKAGES = {
    "v1": ["@bufbuild/protoc-gen-es@1.10.1", "@bufbuild/protobuf@1.10.1",
           "@connectrpc/protoc-gen-connect-es@1.7.0", ESBUILD],
    "v2": ["@bufbuild/protoc-gen-es@2.17.0", "@bufbuild/protobuf@2.17.0", ESBUILD],
}


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "workbench" / "npm"


def install(major: str) -> Path:
    """node_modules prefix for one version set; raises RuntimeError when npm cannot install it."""
    pkgs = PACKAGES[major]
    key = hashlib.sha256(json.dumps(pkgs).encode()).hexdigest()[:12]
    root = _cache_root() / f"{major}-{key}"
    if (root / "node_modules" / ".bin" / "protoc-gen-es").exists() and (root / "node_modules" / ".bin" / "esbuild").exists():
        return root
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{major}-", dir=root.parent))
    (tmp / "package.json").write_text('{"private": true}\n')
    proc = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(tmp), *pkgs],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"npm install {' '.join(pkgs)} failed: {proc.stderr.strip()[-500:]}")
    try:
        os.replace(tmp, root)
    except OSError:  # another session installed it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return root


@dataclass
class Generators:
    v1: Path
    v2: Path

    def prefix(self, major: str) -> Path:
        return self.v1 if major == "v1" else self.v2

    def generate(self, major: str, root: Path, files: list[str], out: Path, target: str = "js") -> list[Path]:
        """protoc-gen-es output (plus connect-es service objects for v1) for ``files`` under ``root``."""
        bin_ = self.prefix(major) / "node_modules" / ".bin"
        out.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"--plugin=protoc-gen-es={bin_ / 'protoc-gen-es'}",
                f"--es_out={out}", f"--es_opt=target={target}"]
        if major == "v1":
            args += [f"--plugin=protoc-gen-connect-es={bin_ / 'protoc-gen-connect-es'}", f"--connect-es_out={out}",
                     f"--connect-es_opt=target={target}"]
        proc = subprocess.run([*args, *files], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        ext = ".ts" if target == "ts" else ".js"
        return sorted(p for p in out.rglob("*" + ext) if p.name != "entry" + ext)

    def bundle(self, major: str, sources: list[Path], src_dir: Path, outfile: Path, *, fmt: str = "esm",
               target: str = "esnext", splitting: bool = False, extra: tuple[str, ...] = ()) -> list[Path]:
        """esbuild --bundle --minify of an entry that re-exports every generated module."""
        ext = sources[0].suffix
        entry = src_dir / ("entry" + ext)
        entry.write_text("".join(f'export * as m{i} from "./{p.relative_to(src_dir).as_posix()}";\n'
                                 for i, p in enumerate(sources)))
        esbuild = self.prefix(major) / "node_modules" / ".bin" / "esbuild"
        env = {**os.environ, "NODE_PATH": str(self.prefix(major) / "node_modules")}
        args = [str(esbuild), "--bundle", "--minify", f"--format={fmt}", f"--target={target}", "--log-level=error",
                *extra]
        if splitting:
            entries = [entry, *sources]
            args += ["--splitting", f"--outdir={outfile}", *map(str, entries)]
        else:
            args += [f"--outfile={outfile}", str(entry)]
        proc = subprocess.run(args, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        return sorted(outfile.rglob("*.js")) if splitting else [outfile]

    def tsc_files(self, sources: list[Path], src_dir: Path, out_dir: Path) -> list[Path]:
        """tsc to CommonJS (``exports.X``, ``require``, ``X.typeName = …``), then each file minified alone."""
        bin_ = self.prefix("v1") / "node_modules" / ".bin"
        plain = out_dir.with_name(out_dir.name + "-tsc")
        args = [str(bin_ / "tsc"), "--outDir", str(plain), "--rootDir", str(src_dir), "--module", "commonjs",
                "--target", "es2017", "--moduleResolution", "node", "--skipLibCheck", "--noEmitOnError", "false",
                *map(str, sources)]
        subprocess.run(args, capture_output=True, text=True)  # type errors (no @types here) do not stop emit
        out: list[Path] = []
        for js in sorted(plain.rglob("*.js")):
            dest = out_dir / js.relative_to(plain)
            dest.parent.mkdir(parents=True, exist_ok=True)
            proc = subprocess.run([str(bin_ / "esbuild"), str(js), "--minify", "--format=cjs", "--log-level=error",
                                   f"--outfile={dest}"], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            out.append(dest)
        assert out, "tsc emitted nothing"
        return out
