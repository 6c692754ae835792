"""The active schema: what every decoding command reads the wire with unless ``--proto`` says otherwise.

Resolution, first match wins (``choose``):

1. ``--proto PATH…`` on the command line (``--proto builtin``: the built-in overlay);
2. the schema made the default with ``workbench schema use``, recorded in
   ``$XDG_CONFIG_HOME/workbench/schema.json`` (``~/.config/workbench/schema.json``): by default a
   self-contained copy (a FileDescriptorSet named by the schema's hash under ``schemas/`` next to
   it, so deleting or editing the extraction later changes nothing), with ``--link`` the paths
   themselves;
3. the built-in overlay.

``decode``, ``import``, ``frames --json``, ``tui`` and ``capture`` (through the addon option
``cursor_schema``, since the capture writer runs inside mitmdump) resolve it with
``active_schema``; library code that is given no decoder keeps the overlay. A configured schema
that cannot be used is an error naming the configuration file, never a silent fallback.

Each writer (capture, import, client) stamps the sessions it creates with ``schema_stamp``: the
identity of the schema its frames were decoded with, so a capture says what it was read with.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

from workbench.jsontypes import JsonObject
from workbench.schema.loader import Schema, SchemaError, load_schema

BUILTIN = "builtin"
CONFIG_NAME = "schema.json"
COPIES = "schemas"
CONFIG_VERSION = 1


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "workbench"


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


@dataclass(frozen=True)
class Choice:
    """Which schema is active and why.

    ``paths`` empty means the built-in overlay; ``via`` is ``--proto``, ``schema use`` or
    ``built-in``; ``config`` the configuration file (for ``schema use``); ``source`` the name the
    schema's identity carries (what a copy was made from); ``copied_from`` the original paths of
    a copy (None when the configuration references the paths themselves).
    """

    paths: tuple[str, ...]
    via: str
    config: str | None = None
    source: str | None = None
    copied_from: tuple[str, ...] | None = None


def read_config(path: Path | None = None) -> JsonObject | None:
    """The ``schema use`` configuration, None when there is none; SchemaError when it is unreadable."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SchemaError(f"{path}: {exc.strerror}") from exc
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise SchemaError(f"{path}: not JSON ({exc}); run 'workbench schema use --reset' or use a schema again") from exc
    paths = cfg.get("paths") if isinstance(cfg, dict) else None
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise SchemaError(f"{path}: no schema paths in it; run 'workbench schema use --reset' or use a schema again")
    return dict(cfg)


def choose(proto: Sequence[str | Path] = ()) -> Choice:
    """The schema a command with these ``--proto`` values decodes with (see the module docstring)."""
    if proto:
        if [str(p) for p in proto] == [BUILTIN]:
            return Choice((), "--proto")
        return Choice(tuple(str(p) for p in proto), "--proto")
    cfg = read_config()
    if cfg is None:
        return Choice((), "built-in")
    copied = cfg.get("copied_from")
    copied_from = tuple(copied) if isinstance(copied, list) else None
    source = ", ".join(copied_from) if copied_from else None
    return Choice(tuple(cfg["paths"]), "schema use", str(config_path()), source, copied_from)


def schema_of(choice: Choice) -> Schema:
    """Load the chosen schema; a configured one that fails names the configuration file."""
    if not choice.paths:
        return load_schema()
    try:
        return load_schema(choice.paths, source=choice.source)
    except SchemaError as exc:
        if choice.config is None:
            raise
        raise SchemaError(f"the schema made the default in {choice.config} cannot be used: {exc} "
                          "(run 'workbench schema use --reset' to go back to the built-in overlay)") from exc


def active_schema(proto: Sequence[str | Path] = ()) -> Schema:
    """The schema decoding commands use: ``--proto``, else the ``schema use`` default, else the overlay."""
    return schema_of(choose(proto))


def schema_for_option(value: str) -> Schema:
    """The capture addon's ``cursor_schema``: empty = the active schema, ``builtin``, or paths joined by ``os.pathsep``."""
    value = value.strip()
    if not value:
        return active_schema()
    return active_schema([p for p in value.split(os.pathsep) if p])


def schema_option(proto: Sequence[str | Path]) -> str:
    """The ``cursor_schema`` value that makes the capture addon decode with ``--proto`` (empty: the active one)."""
    if not proto:
        return ""
    if [str(p) for p in proto] == [BUILTIN]:
        return BUILTIN
    return os.pathsep.join(str(Path(p).resolve()) for p in proto)


def schema_stamp(schema: Schema) -> dict[str, Any]:
    """``{"schema": {hash, source, messages}}`` for a session's meta: what its frames were decoded with."""
    ident = schema.identity
    return {"schema": {"hash": ident.hash, "source": ident.source, "messages": ident.messages}}


def use(paths: Sequence[str | Path], *, link: bool = False) -> tuple[Choice, Schema]:
    """Make ``paths`` the default schema (checked by loading it first); returns the new choice."""
    if [str(p) for p in paths] == [BUILTIN]:
        reset()
        choice = choose()
        return choice, schema_of(choice)
    resolved = [str(Path(p).resolve()) for p in paths]
    schema = load_schema(resolved)
    cfg_dir = config_dir()
    cfg: JsonObject = {"version": CONFIG_VERSION, "hash": schema.identity.hash,
                           "messages": schema.identity.messages,
                           "configured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        old = read_config()
    except SchemaError:
        old = None  # an unreadable configuration is simply replaced
    if link:
        cfg.update(paths=resolved, copied_from=None)
    else:
        fds = descriptor_pb2.FileDescriptorSet()
        fds.file.extend(schema.own_files)
        copy = cfg_dir / COPIES / f"{schema.identity.hash}.pb"
        _write_atomic(copy, fds.SerializeToString(deterministic=True))
        cfg.update(paths=[str(copy)], copied_from=resolved)
    _write_atomic(config_path(), (json.dumps(cfg, indent=1) + "\n").encode())
    if old is not None:
        _drop_copies(old, keep=cfg["paths"])
    choice = choose()
    return choice, schema_of(choice)


def reset() -> bool:
    """Go back to the built-in overlay; True when a default schema was configured."""
    path = config_path()
    if not path.exists():
        return False
    try:
        old = read_config()
    except SchemaError:
        old = None
    path.unlink()
    if old is not None:
        _drop_copies(old, keep=[])
    return True


def _drop_copies(cfg: JsonObject, keep: Sequence[str]) -> None:
    """Remove copies an older configuration made (only files inside our own ``schemas/`` folder)."""
    if not cfg.get("copied_from"):
        return
    home = (config_dir() / COPIES).resolve()
    for p in cfg.get("paths", []):
        path = Path(p)
        if p not in keep and path.resolve().parent == home:
            path.unlink(missing_ok=True)


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise SchemaError(f"{path}: cannot write ({exc.strerror})") from exc
