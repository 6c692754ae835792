"""Build protobuf descriptors from our ``.proto`` overlay (and users' own) at run time.

The overlay is compiled with grpcio-tools' bundled protoc into a FileDescriptorSet, cached on disk
by content hash so only the first start pays for protoc. User protos (``--proto``) are compiled
into a separate pool: they usually redefine our messages (a schema extracted from a newer Cursor
build), and a type found there wins over the built-in one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

PROTO_ROOT = Path(__file__).resolve().parent / "proto"
BUILTIN_FILES = ("agent/v1/agent.proto", "aiserver/v1/aiserver.proto")


class SchemaError(Exception):
    """A .proto file could not be found or compiled; the message names the file."""


def _grpc_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).resolve().parent / "_proto")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "workbench" / "schema"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = Path(tempfile.gettempdir()) / "workbench-schema"
        path.mkdir(parents=True, exist_ok=True)
    return path


def compile_protos(files: Sequence[Path], includes: Sequence[Path]) -> descriptor_pb2.FileDescriptorSet:
    """Run protoc in-process; raise SchemaError with protoc's own message on failure."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f).encode())
        try:
            digest.update(f.read_bytes())
        except OSError as exc:
            raise SchemaError(f"{f}: {exc.strerror}") from exc
    for inc in includes:
        digest.update(str(inc).encode())
    cached = _cache_dir() / f"{digest.hexdigest()[:24]}.pb"
    if not cached.exists():
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        args = [sys.executable, "-m", "grpc_tools.protoc", *(f"-I{inc}" for inc in includes),
                f"-I{_grpc_include()}", f"--descriptor_set_out={tmp}", "--include_imports"]
        args += [str(f) for f in files]
        # A subprocess, because protoc writes warnings straight to file descriptor 2.
        proc = subprocess.run(args, capture_output=True, text=True)
        if proc.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            names = ", ".join(str(f) for f in files)
            raise SchemaError(f"protoc failed on {names}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
        os.replace(tmp, cached)
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(cached.read_bytes())
    return fds


def _pool_from(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    return pool


def _expand(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    files: list[Path] = []
    includes: list[Path] = []
    for p in paths:
        path = Path(p).resolve()
        if path.is_dir():
            found = sorted(path.rglob("*.proto"))
            if not found:
                raise SchemaError(f"{path}: no .proto files in this folder")
            files += found
            includes.append(path)
        elif path.is_file():
            files.append(path)
            includes.append(path.parent)
        else:
            raise SchemaError(f"{path}: no such .proto file or folder")
    return files, includes


class Schema:
    """Message classes by full name; user protos take precedence over the overlay."""

    def __init__(self, builtin: descriptor_pool.DescriptorPool,
                 user: descriptor_pool.DescriptorPool | None = None) -> None:
        self.builtin = builtin
        self.user = user
        self._classes: dict[str, type[Message]] = {}

    def descriptor(self, full_name: str) -> Descriptor:
        if self.user is not None:
            try:
                return self.user.FindMessageTypeByName(full_name)
            except KeyError:
                pass
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


@lru_cache(maxsize=1)
def _builtin_pool() -> descriptor_pool.DescriptorPool:
    files = [PROTO_ROOT / f for f in BUILTIN_FILES]
    return _pool_from(compile_protos(files, [PROTO_ROOT]))


def _merged_pool(user_fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool | None:
    """One pool where the user's types replace the overlay's, also where the overlay refers to them.

    A user file usually redefines a handful of messages (say ``agent.v1.TextDelta`` with a field
    a newer build added). Looking names up in the user's pool first is not enough: the overlay's
    ``InteractionUpdate`` would still embed the overlay's ``TextDelta``. So the overlay files are
    re-added without the redefined types and with the user's files as dependencies. Returns None
    when the files cannot be combined (the caller then falls back to a separate user pool).
    """
    builtin = compile_protos([PROTO_ROOT / f for f in BUILTIN_FILES], [PROTO_ROOT])
    builtin_names = {f.name for f in builtin.file}
    user_files = [f for f in user_fds.file if f.name not in builtin_names]
    defined: dict[str, str] = {}
    for f in user_files:
        prefix = f.package + "." if f.package else ""
        for m in f.message_type:
            defined[prefix + m.name] = f.name
        for e in f.enum_type:
            defined[prefix + e.name] = f.name
    if not defined:
        return None
    overriding = sorted(set(defined.values()))
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for f in builtin.file:
        copy = descriptor_pb2.FileDescriptorProto()
        copy.CopyFrom(f)
        prefix = f.package + "." if f.package else ""
        keep_m = [m for m in f.message_type if prefix + m.name not in defined]
        keep_e = [e for e in f.enum_type if prefix + e.name not in defined]
        if len(keep_m) != len(f.message_type) or len(keep_e) != len(f.enum_type) or f.name in BUILTIN_FILES:
            del copy.message_type[:]
            copy.message_type.extend(keep_m)
            del copy.enum_type[:]
            copy.enum_type.extend(keep_e)
            copy.dependency.extend(d for d in overriding if d not in copy.dependency and d != f.name)
        files[f.name] = copy
    for f in user_files:
        files.setdefault(f.name, f)
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str, stack: tuple[str, ...]) -> None:
        if name in added or name not in files:
            return
        if name in stack:
            raise ValueError(f"import cycle through {name}")
        for dep in files[name].dependency:
            add(dep, (*stack, name))
        pool.Add(files[name])
        added.add(name)

    try:
        for name in files:
            add(name, ())
    except Exception:  # incompatible redefinitions: keep the user's pool separate instead
        return None
    return pool


_schemas: dict[tuple[str, ...], Schema] = {}


def load_schema(extra: Sequence[str | Path] = ()) -> Schema:
    """The overlay, plus user ``.proto`` files or folders (taking precedence) when given."""
    key = tuple(str(Path(p).resolve()) for p in extra)
    schema = _schemas.get(key)
    if schema is None:
        user = None
        if extra:
            files, includes = _expand(extra)
            user_fds = compile_protos(files, [*includes, PROTO_ROOT])
            user = _merged_pool(user_fds) or _pool_from(user_fds)
        schema = Schema(_builtin_pool(), user)
        _schemas[key] = schema
    return schema
