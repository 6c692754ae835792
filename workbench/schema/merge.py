"""Combine a user schema with the built-in overlay into one descriptor pool.

Rules (docs/schema.md, "Bringing your own schema"):

* every message, enum and service the user's files define replaces the overlay's of the same full
  name, also where the overlay's remaining messages refer to it;
* the overlay's other types stay, so a partial user schema only changes what it names;
* the transport wrappers (``PINNED``) are ours: their layout is knowledge of the HTTP/1.1 bidi
  emulation rather than of Cursor's schema, so the user's definitions of them are set aside (and
  said so in the notes);
* two user files defining the same type, or the same file name with different content, is a
  conflict naming both files and the type;
* anything that does not combine raises ``SchemaError``: there is no silent fallback.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool

from workbench.errors import WorkbenchError

PINNED = ("aiserver.v1.BidiRequestId", "aiserver.v1.BidiAppendRequest", "aiserver.v1.BidiPollRequest",
          "aiserver.v1.BidiPollResponse")
OVERLAY_PREFIX = "workbench-overlay/"


class MergeError(WorkbenchError):
    """The user's files and the overlay do not combine; the text names files and types."""


def top_level_names(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, str]:
    """Full name → "message" / "enum" / "service" of a file's top-level definitions."""
    prefix = fd.package + "." if fd.package else ""
    out = {prefix + m.name: "message" for m in fd.message_type}
    out.update({prefix + e.name: "enum" for e in fd.enum_type})
    out.update({prefix + s.name: "service" for s in fd.service})
    return out


def count_types(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> tuple[int, int, int]:
    """(messages, enums, services) including nested types, map entries excluded."""
    messages = enums = services = 0

    def walk(m: descriptor_pb2.DescriptorProto) -> None:
        nonlocal messages, enums
        if m.options.map_entry:
            return
        messages += 1
        enums += len(m.enum_type)
        for n in m.nested_type:
            walk(n)

    for fd in files:
        for m in fd.message_type:
            walk(m)
        enums += len(fd.enum_type)
        services += len(fd.service)
    return messages, enums, services


def check_user_files(user: list[descriptor_pb2.FileDescriptorProto], origin: dict[str, str]) -> None:
    """Conflicts between user files: one type defined twice. ``origin`` maps file name → path."""
    owner: dict[str, str] = {}
    problems: list[str] = []
    for fd in user:
        for name in top_level_names(fd):
            if name in owner and owner[name] != fd.name:
                problems.append(f"{name} is defined in both {origin.get(owner[name], owner[name])} "
                                f"and {origin.get(fd.name, fd.name)}")
            owner.setdefault(name, fd.name)
    if problems:
        raise MergeError("conflicting definitions: " + "; ".join(problems[:10])
                         + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))


def merged_pool(builtin: descriptor_pb2.FileDescriptorSet, user: list[descriptor_pb2.FileDescriptorProto],
                origin: dict[str, str]) -> tuple[descriptor_pool.DescriptorPool, list[str], int]:
    """(pool, notes, overlay types replaced). ``user`` excludes overlay and well-known files."""
    notes: list[str] = []
    builtin_files = {f.name: f for f in builtin.file}
    user_names = {f.name for f in user}
    defined: dict[str, str] = {}  # full name → user file
    for fd in user:
        for name in top_level_names(fd):
            defined.setdefault(name, fd.name)
    pinned_home: dict[str, str] = {}
    for fd in builtin.file:
        for name in top_level_names(fd):
            if name in PINNED:
                pinned_home[name] = fd.name

    def overlay_name(name: str) -> str:
        return OVERLAY_PREFIX + name if name in user_names else name

    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    replaced = 0
    for fd in builtin.file:
        copy = descriptor_pb2.FileDescriptorProto()
        copy.CopyFrom(fd)
        copy.name = overlay_name(fd.name)
        prefix = fd.package + "." if fd.package else ""
        keep = [m for m in fd.message_type if prefix + m.name in PINNED or prefix + m.name not in defined]
        keep_e = [e for e in fd.enum_type if prefix + e.name not in defined]
        keep_s = [s for s in fd.service if prefix + s.name not in defined]
        replaced += (len(fd.message_type) - len(keep)) + (len(fd.enum_type) - len(keep_e))
        del copy.message_type[:]
        copy.message_type.extend(keep)
        del copy.enum_type[:]
        copy.enum_type.extend(keep_e)
        del copy.service[:]
        copy.service.extend(keep_s)
        deps = [overlay_name(d) for d in fd.dependency]
        # The overlay's remaining messages may refer to types the user now defines.
        deps += sorted({defined[n] for n in _referenced(copy) if n in defined and n not in PINNED})
        del copy.dependency[:]
        copy.dependency.extend(dict.fromkeys(d for d in deps if d != copy.name))
        files[copy.name] = copy
    for fd in user:
        copy = descriptor_pb2.FileDescriptorProto()
        copy.CopyFrom(fd)
        prefix = fd.package + "." if fd.package else ""
        dropped = [m.name for m in fd.message_type if prefix + m.name in PINNED]
        if dropped:
            kept = [m for m in fd.message_type if prefix + m.name not in PINNED]
            del copy.message_type[:]
            copy.message_type.extend(kept)
            for name in dropped:
                home = overlay_name(pinned_home[prefix + name])
                if home not in copy.dependency:
                    copy.dependency.append(home)
            notes.append(f"{origin.get(fd.name, fd.name)}: kept the built-in "
                         + ", ".join(prefix + n for n in dropped)
                         + " (transport wrappers the decoder unwraps itself)")
        copy.dependency[:] = [d if d in user_names or d not in builtin_files else overlay_name(d)
                              for d in copy.dependency]
        # a user file importing an overlay file by its own name (never shadowed: it is not a user file)
        files[copy.name] = copy
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str, stack: tuple[str, ...]) -> None:
        if name in added:
            return
        if name not in files:
            raise MergeError(f"{origin.get(stack[-1], stack[-1]) if stack else name}: imports {name}, "
                             "which is in neither the given files nor the overlay")
        if name in stack:
            raise MergeError("import cycle: " + " → ".join((*stack, name)))
        for dep in files[name].dependency:
            add(dep, (*stack, name))
        try:
            pool.Add(files[name])
        except Exception as exc:  # TypeError/KeyError from the C++ or upb pool, with its own text
            where = origin.get(name, "the built-in overlay" if name in builtin_files or
                               name.startswith(OVERLAY_PREFIX) else name)
            raise MergeError(f"{where} ({name}) does not combine with the rest of the schema: {exc}") from exc
        added.add(name)

    for name in files:
        add(name, ())
    return pool, notes, replaced


def _referenced(fd: descriptor_pb2.FileDescriptorProto) -> set[str]:
    """Full names (no leading dot) of the types a file uses, and of the messages enclosing them."""
    out = referenced_types(fd)
    # a nested type name a.b.C.D is used through its top-level message a.b.C
    for name in list(out):
        parts = name.split(".")
        for i in range(1, len(parts)):
            out.add(".".join(parts[:i]))
    return out


def referenced_types(fd: descriptor_pb2.FileDescriptorProto) -> set[str]:
    """Full names (no leading dot) of the types a file's fields, extensions and methods name."""
    out: set[str] = set()

    def walk(m: descriptor_pb2.DescriptorProto) -> None:
        for f in list(m.field) + list(m.extension):
            out.add(f.type_name.lstrip("."))
            out.add(f.extendee.lstrip("."))
        for n in m.nested_type:
            walk(n)

    for m in fd.message_type:
        walk(m)
    for f in fd.extension:
        out.add(f.type_name.lstrip("."))
        out.add(f.extendee.lstrip("."))
    for s in fd.service:
        for meth in s.method:
            out.add(meth.input_type.lstrip("."))
            out.add(meth.output_type.lstrip("."))
    out.discard("")
    return out
