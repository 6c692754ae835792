"""Recover a protobuf schema from JavaScript that protobuf-es generated (``workbench schema extract``).

``extract(paths)`` scans ``.js``/``.mjs``/``.cjs`` files (or folders of them) for protobuf-es v1
definitions (``v1.py``) and v2 embedded descriptors (``v2.py``), resolves minified references
across files (``resolve.py``) and builds FileDescriptorProtos (``build.py``). ``write`` puts
``.proto`` files (``render.py``), an optional FileDescriptorSet and ``report.json`` on disk.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool

from workbench.errors import WorkbenchError
from workbench.schema.extract import v1, v2
from workbench.schema.extract.build import Extraction, Problem, build
from workbench.schema.extract.wkt import well_known_files
from workbench.schema.merge import count_types
from workbench.schema.render import render_file

JS_SUFFIXES = (".js", ".mjs", ".cjs")

__all__ = ["Extraction", "Problem", "extract", "js_files", "write"]


class ExtractError(WorkbenchError):
    """A path given to extract does not exist or holds no JavaScript."""


def js_files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.rglob("*") if f.suffix in JS_SUFFIXES and f.is_file())
            if not found:
                raise ExtractError(f"{path}: no .js, .mjs or .cjs files in this folder")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise ExtractError(f"{path}: no such file or folder")
    return list(dict.fromkeys(out))


def read_text(path: Path) -> str:
    """The file as text, one character a byte (offsets stay byte offsets; names are ASCII), decoded
    straight from a memory map of the file: one copy of a 100 MB bundle is held, not the bytes and
    the text."""
    with path.open("rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return ""
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return str(mapped, "latin-1")


def extract(paths: Sequence[str | Path]) -> Extraction:
    """Scan the files and build the schema they define (see the module docstring)."""
    files = js_files(paths)
    scans: list[v1.FileScan] = []
    embedded: list[v2.EmbeddedFile] = []
    problems: list[Problem] = []
    counts: list[tuple[str, int, int]] = []
    for f in files:
        try:
            text = read_text(f)
        except OSError as exc:
            raise ExtractError(f"{f}: {exc.strerror}") from exc
        name = str(f)
        sc = v1.scan(name, text)
        es = v2.scan(name, text)
        scans.append(sc)
        embedded += es.files
        problems += [Problem(name, pos, msg) for pos, msg in sc.errors + es.errors]
        n = len(sc.found) + len(es.files)
        counts.append((name, len(text), n))
        if n == 0 and not sc.errors and not es.errors:
            problems.append(Problem(name, None, "no protobuf-es code found (no makeMessageType, makeEnum, "
                                                "setEnumType, message class statics or embedded descriptors)"))
    ex = build(scans, embedded, problems)
    ex.scanned = counts
    _check_pool(ex)
    return ex


def _check_pool(ex: Extraction) -> None:
    """Add the files to a descriptor pool, as protoc would see them; report what does not load."""
    pool = descriptor_pool.DescriptorPool()
    wkt = set(well_known_files().values())

    by_name = {f.name: f for f in ex.files}
    added: set[str] = set()

    def add(name: str, stack: tuple[str, ...]) -> bool:
        if name in added:
            return True
        if name in wkt:
            mod = "google.protobuf." + name.removeprefix("google/protobuf/").removesuffix(".proto").replace("/", ".")
            fdp = descriptor_pb2.FileDescriptorProto()
            import_module(mod + "_pb2").DESCRIPTOR.CopyToProto(fdp)
            pool.Add(fdp)
            added.add(name)
            return True
        fd = by_name.get(name)
        if fd is None or name in stack:
            ex.problems.append(Problem(stack[-1] if stack else name, None,
                                       f"import cycle through {name}" if fd else f"imports missing {name}"))
            return False
        ok = all(add(d, (*stack, name)) for d in fd.dependency)
        try:
            pool.Add(fd)
        except Exception as exc:  # the pool's own message names the type
            ex.problems.append(Problem(name, None, f"does not load as a descriptor: {exc}"))
            return False
        added.add(name)
        return ok

    for f in ex.files:
        add(f.name, ())


def descriptor_set(ex: Extraction) -> descriptor_pb2.FileDescriptorSet:
    """The extracted files plus the well-known files they import (self-contained, like --include_imports)."""
    fds = descriptor_pb2.FileDescriptorSet()
    for name in sorted(ex.wkt & _imported(ex)):
        mod = "google.protobuf." + name.removeprefix("google/protobuf/").removesuffix(".proto").replace("/", ".")
        import_module(mod + "_pb2").DESCRIPTOR.CopyToProto(fds.file.add())
    fds.file.extend(ex.files)
    return fds


def _imported(ex: Extraction) -> set[str]:
    return {d for f in ex.files for d in f.dependency}


def report(ex: Extraction) -> dict[str, Any]:
    packages: dict[str, dict[str, int]] = {}

    for f in ex.files:
        m, e, s = count_types([f])
        p = packages.setdefault(f.package or "(none)", {"files": 0, "messages": 0, "enums": 0, "services": 0})
        p["files"] += 1
        p["messages"] += m
        p["enums"] += e
        p["services"] += s
    return {
        "counts": ex.counts(),
        "packages": packages,
        "inputs": [{"file": n, "bytes": b, "definitions": d} for n, b, d in ex.scanned],
        "files": [f.name for f in ex.files],
        "well_known_imports": sorted(ex.wkt & _imported(ex)),
        "sources": ex.sources,
        "problems": [{"file": p.path, "offset": p.pos, "problem": p.text} for p in ex.problems],
    }


def write(ex: Extraction, out_dir: Path | None, descriptor_set_path: Path | None = None) -> list[Path]:
    """Write ``.proto`` files (and ``report.json``) under ``out_dir``, and/or the descriptor set."""
    written: list[Path] = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)

        def comment(full: str) -> str | None:
            src = ex.sources.get(full)
            if not src:
                return None
            more = f" (+{len(src) - 1} more)" if len(src) > 1 else ""
            return f"from {src[0]}{more}"

        for fd in ex.files:
            path = out_dir / fd.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render_file(fd, comment, header="Extracted by `workbench schema extract` from "
                                                             "protobuf-es generated JavaScript."))
            written.append(path)
        rep = out_dir / "report.json"
        rep.write_text(json.dumps(report(ex), indent=1) + "\n")
        written.append(rep)
    if descriptor_set_path is not None:
        descriptor_set_path.parent.mkdir(parents=True, exist_ok=True)
        descriptor_set_path.write_bytes(descriptor_set(ex).SerializeToString())
        written.append(descriptor_set_path)
    return written
