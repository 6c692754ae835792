"""Build protobuf descriptors from our ``.proto`` overlay (and users' own) at run time.

The overlay is compiled with grpcio-tools' bundled protoc into a FileDescriptorSet, cached on disk
by content hash so only the first start pays for protoc. A user schema (``--proto``: ``.proto``
files, folders of them, or FileDescriptorSet files such as ``workbench schema extract`` writes;
several of each) is compiled in one protoc run with every folder as an include root, so imports
between the files resolve, and merged with the overlay (``merge.py``): its types replace ours,
also where our remaining messages embed them. Whatever cannot be used raises ``SchemaError``,
which the CLI turns into exit 2; there is no silent fallback to the overlay.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from workbench.errors import WorkbenchError
from workbench.schema import contract
from workbench.schema.builtin import BUILTIN_FILES as BUILTIN_FILES  # importable from here, as before
from workbench.schema.builtin import PROTO_ROOT as PROTO_ROOT
from workbench.schema.merge import OVERLAY_PREFIX, MergeError, check_user_files, count_types, merged_pool

DESCRIPTOR_SET_SUFFIXES = (".pb", ".binpb", ".desc", ".fds", ".protoset")
_MAX_PROTOC_LINES = 12


class SchemaError(WorkbenchError):
    """A schema could not be found, compiled or used; the message names the file (and type)."""


def _grpc_include() -> str:
    # grpc_tools (protoc) loads only to compile protos
    import grpc_tools

    return str(Path(grpc_tools.__file__).resolve().parent / "_proto")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "workbench" / "schema"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = Path(tempfile.gettempdir()) / "workbench-schema"
        path.mkdir(parents=True, exist_ok=True)
    return path


def _short_protoc_error(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and "warning:" not in ln]
    if len(lines) > _MAX_PROTOC_LINES:
        lines = lines[:_MAX_PROTOC_LINES] + [f"… and {len(lines) - _MAX_PROTOC_LINES} more lines"]
    return "\n  ".join(lines)


def compile_protos(files: Sequence[Path], includes: Sequence[Path]) -> descriptor_pb2.FileDescriptorSet:
    """Run protoc; raise SchemaError with protoc's own message (which names file and line)."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f).encode())
        try:
            digest.update(f.read_bytes())
        except OSError as exc:
            raise SchemaError(f"{f}: {exc.strerror}") from exc
    for inc in includes:
        digest.update(str(inc).encode())
    cached = cache_dir() / f"{digest.hexdigest()[:24]}.pb"
    if not cached.exists():
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        args = [sys.executable, "-m", "grpc_tools.protoc", *(f"-I{inc}" for inc in includes),
                f"-I{_grpc_include()}", f"--descriptor_set_out={tmp}", "--include_imports"]
        args += [str(f) for f in files]
        # A subprocess, because protoc writes warnings straight to file descriptor 2.
        proc = subprocess.run(args, capture_output=True, text=True)
        if proc.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            names = ", ".join(str(f) for f in files[:3]) + (f" (+{len(files) - 3} more)" if len(files) > 3 else "")
            raise SchemaError(f"protoc failed on {names}:\n  "
                              f"{_short_protoc_error(proc.stderr) or f'exit {proc.returncode}'}")
        os.replace(tmp, cached)
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(cached.read_bytes())
    return fds


def _pool_from(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    return pool


_PACKAGE = re.compile(rb"^\s*package\s+([\w.]+)\s*;", re.M)


def _root_of(path: Path) -> Path:
    """The include root of a single ``.proto`` file: where its package's folders start.

    ``x/agent/v1/agent.proto`` declaring ``package agent.v1`` has root ``x``, so its imports of
    ``aiserver/v1/aiserver.proto`` find ``x/aiserver/v1/aiserver.proto``; otherwise its folder.
    """
    try:
        m = _PACKAGE.search(path.read_bytes()[:65536])
    except OSError as exc:
        raise SchemaError(f"{path}: {exc.strerror}") from exc
    if m:
        parts = m.group(1).decode().split(".")
        folder = path.parent
        if len(folder.parts) > len(parts) and list(folder.parts[-len(parts):]) == parts:
            return folder.parents[len(parts) - 1]
    return path.parent


@dataclass
class _Inputs:
    protos: list[Path] = field(default_factory=list)
    roots: list[Path] = field(default_factory=list)
    sets: list[Path] = field(default_factory=list)
    names: dict[str, Path] = field(default_factory=dict)  # name inside the schema → file


def _expand(paths: Iterable[str | Path]) -> _Inputs:
    out = _Inputs()

    def add(path: Path, root: Path) -> None:
        name = path.relative_to(root).as_posix()
        other = out.names.get(name)
        if other is not None and other != path:
            raise SchemaError(f"conflict: {other} and {path} are both {name}; pass only one of them")
        if other is None:
            out.names[name] = path
            out.protos.append(path)
        if root not in out.roots:
            out.roots.append(root)

    for p in paths:
        path = Path(p).resolve()
        if path.is_dir():
            found = sorted(f for f in path.rglob("*.proto") if not any(s.startswith(".") for s in
                                                                         f.relative_to(path).parts))
            sets = sorted(f for f in path.rglob("*") if f.suffix in DESCRIPTOR_SET_SUFFIXES and f.is_file())
            if not found and not sets:
                raise SchemaError(f"{path}: no .proto files (or descriptor sets) in this folder")
            for f in found:
                add(f, path)
            out.sets += [s for s in sets if s not in out.sets]
        elif path.is_file():
            if path.suffix in DESCRIPTOR_SET_SUFFIXES:
                if path not in out.sets:
                    out.sets.append(path)
            else:
                add(path, _root_of(path))
        else:
            raise SchemaError(f"{path}: no such .proto file or folder")
    return out


def read_descriptor_set(path: Path) -> descriptor_pb2.FileDescriptorSet:
    fds = descriptor_pb2.FileDescriptorSet()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SchemaError(f"{path}: {exc.strerror}") from exc
    try:
        fds.ParseFromString(data)
    except DecodeError as exc:
        raise SchemaError(f"{path}: not a FileDescriptorSet ({exc})") from exc
    if not fds.file or not all(f.name for f in fds.file):
        raise SchemaError(f"{path}: not a FileDescriptorSet (no named files)")
    return fds


@dataclass(frozen=True)
class SchemaIdentity:
    """What a decoded capture was read with: hash, source and counts."""

    hash: str
    source: str
    messages: int
    enums: int
    services: int
    user_messages: int = 0
    replaced: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"hash": self.hash, "source": self.source, "messages": self.messages, "enums": self.enums,
                "services": self.services, "user_messages": self.user_messages, "replaced": self.replaced}


class Schema:
    """Message classes by full name; a user schema's types replace the overlay's.

    ``builtin`` is the overlay's pool, ``user`` the merged pool (None without a user schema).
    ``files`` are the descriptors in force, ``notes`` what the merge decided on the user's behalf,
    ``own_files`` the user schema's own files plus the well-known files they import (empty for the
    overlay): a self-contained copy of what the user gave (``workbench schema use`` stores it).
    """

    def __init__(self, builtin: descriptor_pool.DescriptorPool,
                 user: descriptor_pool.DescriptorPool | None = None, *,
                 identity: SchemaIdentity | None = None, notes: Sequence[str] = (),
                 files: Sequence[descriptor_pb2.FileDescriptorProto] = (),
                 own_files: Sequence[descriptor_pb2.FileDescriptorProto] = ()) -> None:
        self.builtin = builtin
        self.user = user
        self.identity = identity or SchemaIdentity("", "built-in overlay", 0, 0, 0)
        self.notes = list(notes)
        self.files = list(files)
        self.own_files = list(own_files)
        self._classes: dict[str, type[Message]] = {}

    def descriptor(self, full_name: str) -> Descriptor:
        if self.user is not None:
            return self.user.FindMessageTypeByName(full_name)
        return self.builtin.FindMessageTypeByName(full_name)

    def message_class(self, full_name: str) -> type[Message]:
        cls = self._classes.get(full_name)
        if cls is None:
            cls = message_factory.GetMessageClass(self.descriptor(full_name))
            self._classes[full_name] = cls
        return cls

    def has(self, full_name: str) -> bool:
        try:
            self.descriptor(full_name)
        except KeyError:
            return False
        return True


def descriptor_hash(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> str:
    digest = hashlib.sha256()
    for fd in sorted(files, key=lambda f: f.name):
        digest.update(fd.SerializeToString(deterministic=True))
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def builtin_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    return compile_protos([PROTO_ROOT / f for f in BUILTIN_FILES], [PROTO_ROOT])


@lru_cache(maxsize=1)
def _builtin_schema() -> Schema:
    fds = builtin_descriptor_set()
    m, e, s = count_types(fds.file)
    return Schema(_pool_from(fds), None, identity=SchemaIdentity(descriptor_hash(fds.file), "built-in overlay", m, e, s),
                  files=list(fds.file))


def _user_files(inputs: _Inputs) -> tuple[list[descriptor_pb2.FileDescriptorProto],
                                          list[descriptor_pb2.FileDescriptorProto], dict[str, str]]:
    """(user files, extra well-known files, file name → path) of all inputs.

    Every file of a descriptor set counts as given (a set is what its author chose to ship), so a
    schema reads the same from its ``.proto`` folder and from its descriptor set; a ``.proto``
    file's imports that equal the overlay's files are the overlay itself.
    """
    builtin = {f.name: f for f in builtin_descriptor_set().file}
    origin: dict[str, str] = {name: str(path) for name, path in inputs.names.items()}
    found: list[descriptor_pb2.FileDescriptorProto] = []
    given = set(inputs.names)
    if inputs.protos:
        fds = compile_protos(inputs.protos, [*inputs.roots, PROTO_ROOT])
        found += list(fds.file)
    for path in inputs.sets:
        for fd in read_descriptor_set(path).file:
            origin.setdefault(fd.name, str(path))
            found.append(fd)
            if not fd.name.startswith("google/protobuf/"):
                given.add(fd.name)
    user: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    shared: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for fd in found:
        same_as_builtin = fd.name in builtin and fd.SerializeToString(deterministic=True) == \
            builtin[fd.name].SerializeToString(deterministic=True)
        if same_as_builtin and fd.name not in given:
            continue  # the overlay itself, imported by a user file
        if fd.name.startswith("google/protobuf/") and fd.name not in given:
            if fd.name not in builtin:
                shared.setdefault(fd.name, fd)
            continue
        prev = user.get(fd.name)
        if prev is not None and prev.SerializeToString(deterministic=True) != fd.SerializeToString(deterministic=True):
            raise SchemaError(f"conflict: {origin.get(fd.name, fd.name)} and another input both define file "
                              f"{fd.name} with different content")
        user[fd.name] = fd
    return list(user.values()), list(shared.values()), origin


def schema_files(paths: Sequence[str | Path]) -> list[descriptor_pb2.FileDescriptorProto]:
    """The files a schema defines, as given (compiled, not merged with the overlay or checked against
    the decoder's needs): what ``workbench schema diff`` compares."""
    user, _shared, _origin = _user_files(_expand(paths))
    if not user:
        raise SchemaError(f"{', '.join(str(p) for p in paths)}: defines no types of its own "
                          "(only copies of the built-in overlay or well-known types)")
    return user


_schemas: dict[tuple[str, ...], Schema] = {}


def load_schema(extra: Sequence[str | Path] = (), *, source: str | None = None) -> Schema:
    """The overlay, plus a user schema (files, folders, descriptor sets) whose types replace ours.

    ``source`` names the schema in its identity instead of the paths (a copy kept by
    ``workbench schema use`` is named after what it was copied from).
    """
    paths = tuple(str(Path(p).resolve()) for p in extra)
    key = (*paths, f"source={source}") if source and extra else paths
    schema = _schemas.get(key)
    if schema is not None:
        return schema
    base = _builtin_schema()
    if not extra:
        _schemas[key] = base
        return base
    inputs = _expand(extra)
    user, shared, origin = _user_files(inputs)
    source = source or ", ".join(paths)
    if not user:
        raise SchemaError(f"{source}: defines no types of its own (only copies of the built-in overlay "
                          "or well-known types)")
    builtin = descriptor_pb2.FileDescriptorSet()
    builtin.CopyFrom(builtin_descriptor_set())
    builtin.file.extend(shared)
    try:
        check_user_files(user, origin)
        pool, notes, replaced = merged_pool(builtin, user, origin)
    except MergeError as exc:
        raise SchemaError(str(exc)) from exc
    problems = contract.check(pool.FindMessageTypeByName)
    if problems:
        raise SchemaError(f"{source} cannot be used by the decoder: " + "; ".join(problems[:8])
                          + (f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""))
    files = [pool.FindFileByName(n) for n in _file_names(builtin, user)]
    protos = []
    for f in files:
        p = descriptor_pb2.FileDescriptorProto()
        f.CopyToProto(p)
        protos.append(p)
    m, e, s = count_types(protos)
    um, _, _ = count_types(user)
    if um == 0 and not any(f.enum_type or f.service for f in user):
        notes.append(f"{source}: defines no message types")
    identity = SchemaIdentity(descriptor_hash(user), source, m, e, s, user_messages=um, replaced=replaced)
    used = {d for f in user for d in f.dependency}
    schema = Schema(base.builtin, pool, identity=identity, notes=notes, files=protos,
                    own_files=[*_needed_well_known(used, shared), *user])
    _schemas[key] = schema
    return schema


def _needed_well_known(names: set[str], shared: list[descriptor_pb2.FileDescriptorProto]
                       ) -> list[descriptor_pb2.FileDescriptorProto]:
    """The well-known files among ``names`` (and what they import), from ``shared`` or the overlay's set."""
    known = {f.name: f for f in builtin_descriptor_set().file if f.name.startswith("google/protobuf/")}
    known.update({f.name: f for f in shared})
    out: dict[str, descriptor_pb2.FileDescriptorProto] = {}

    def add(name: str) -> None:
        fd = known.get(name)
        if fd is None or name in out:
            return
        for dep in fd.dependency:
            add(dep)
        out[name] = fd

    for name in sorted(names):
        add(name)
    return list(out.values())


def _file_names(builtin: descriptor_pb2.FileDescriptorSet,
                user: list[descriptor_pb2.FileDescriptorProto]) -> list[str]:
    names = [f.name for f in user]
    taken = set(names)
    names += [OVERLAY_PREFIX + f.name if f.name in taken else f.name for f in builtin.file]
    return names
