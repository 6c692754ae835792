"""Resolve a minified reference (``T: xe``, ``T: o.Foo``, ``a.getEnumType(Lo)``) to a type name.

Order of evidence, most specific first:

1. a binding of that name in the same file whose scope holds the reference (``class n`` inside
   its own body; where a file binds one short name to several types, as separately minified
   apps or module functions in one bundle do, the ``{}`` block each is declared in, innermost
   first), else the nearest binding of that name in the file;
2. an ESM import of that name, followed through the chunk's ``export {a as b}`` (and re-exports);
3. for ``ns.Foo``: the module ``ns`` was imported or required from, then bindings made as
   ``exports.Foo = …`` or exported as ``Foo``;
4. a binding of that name in exactly one other file (scripts concatenated without modules);
5. protobuf-es's own naming: a generated export is the type name without package, nested names
   joined by ``_`` (``ErrorDetails_Error``), when exactly one type has that local name.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from workbench.schema.extract.jsread import Call, Ref
from workbench.schema.extract.v1 import Binding, FileScan, syntax_of

_MODULE_SUFFIXES = ("", ".js", ".mjs", ".cjs", "/index.js", "/index.mjs")


def local_name(full_name: str, package: str) -> str:
    rest = full_name[len(package) + 1:] if package and full_name.startswith(package + ".") else full_name
    return rest.replace(".", "_")


class Resolver:
    def __init__(self, scans: Iterable[FileScan], kinds: dict[str, str], packages: dict[str, str],
                 package_of: dict[str, str]) -> None:
        self.scans = {s.path: s for s in scans}
        self.kinds = kinds  # full name → "message" / "enum"
        self.package_of = package_of
        self._near = ""
        self._global: dict[str, list[Binding]] = {}
        for s in self.scans.values():
            for name, bs in s.bindings.items():
                self._global.setdefault(name, []).extend(b for b in bs if b.scope is None)
        self._local: dict[str, list[str]] = {}
        for full, pkg in packages.items():
            self._local.setdefault(local_name(full, pkg), []).append(full)

    def resolve(self, value: object, scan: FileScan, want: str, near: str = "") -> str | None:
        """The full type name ``value`` (a field's ``T``) refers to, of kind ``want``, or None.

        ``near`` is the type holding the reference: when a name is bound several times in a file
        (modules of one bundle reuse short names), a binding to a type of the same package is
        preferred over a nearer one of another package, since generated code mostly refers within
        its package.
        """
        self._near = self.package_of.get(near, near.rsplit(".", 1)[0] if near else "")
        if isinstance(value, Call) and value.callee.endswith("getEnumType") and value.args:
            value = value.args[0]
        if not isinstance(value, Ref):
            return None
        parts = value.path.split(".")
        if len(parts) == 1:
            return self._ident(parts[0], scan, value.pos, want, set())
        return self._member(parts, scan, value.pos, want, set())

    def _foreign(self, type_name: str) -> bool:
        pkg = self.package_of.get(type_name)
        if pkg is None:
            pkg = type_name.rsplit(".", 1)[0]
        return bool(self._near) and pkg != self._near

    def _ok(self, b: Binding, want: str) -> bool:
        return self.kinds.get(b.type_name) == want

    def _ident(self, name: str, scan: FileScan, pos: int | None, want: str, seen: set[tuple[str, str]]) -> str | None:
        key = (scan.path, name)
        if key in seen:
            return None
        seen.add(key)
        cands = [b for b in scan.bindings.get(name, ()) if self._ok(b, want) and not b.member]
        if cands:
            if pos is not None:
                scoped = [b for b in cands if b.scope and b.scope[0] <= pos <= b.scope[1]]
                if scoped:
                    return min(scoped, key=lambda b: b.scope[1] - b.scope[0]).type_name  # type: ignore[index]
            free = [b for b in cands if b.scope is None] or cands
            if pos is None:
                return free[-1].type_name
            # JavaScript scoping: only a binding whose block holds the reference is visible, and the
            # innermost one shadows the others.
            visible = [b for b in free if b.block is not None and b.block[0] <= pos <= b.block[1]]
            if visible:
                inner = max(b.block[0] for b in visible)  # type: ignore[index]
                free = [b for b in visible if b.block[0] == inner]  # type: ignore[index]
            return min(free, key=lambda b: (self._foreign(b.type_name), abs(b.pos - pos))).type_name
        imp = scan.imports.get(name)
        if imp is not None:
            target = self._module(scan.path, imp[0])
            if target is not None:
                found = self._export(target, imp[1], want, seen)
                if found:
                    return found
        glob = {b.type_name for b in self._global.get(name, ()) if self._ok(b, want) and not b.member}
        if len(glob) == 1:
            return glob.pop()
        return self._by_local_name(name, want)

    def _member(self, parts: list[str], scan: FileScan, pos: int, want: str, seen: set[tuple[str, str]]) -> str | None:
        obj, prop = parts[0], parts[-1]
        module = scan.namespaces.get(obj)
        if module is not None and len(parts) == 2 and not module.startswith(".") and "protobuf" in module:
            # the runtime package itself (not among the scanned files): its well-known types
            wkt = "google.protobuf." + prop.replace("_", ".")
            if self.kinds.get(wkt) == want:
                return wkt
        if module is not None and len(parts) == 2:
            target = self._module(scan.path, module)
            if target is not None:
                found = self._export(target, prop, want, seen)
                if found:
                    return found
        members = [b for b in scan.bindings.get(prop, ()) if b.member and self._ok(b, want)]
        if members:
            return min(members, key=lambda b: (self._foreign(b.type_name), abs(b.pos - pos))).type_name
        if prop in scan.exports:
            found = self._export(scan, prop, want, seen)
            if found:
                return found
        props = set()
        for other in self.scans.values():
            for b in other.bindings.get(prop, ()):
                if b.member and self._ok(b, want):
                    props.add(b.type_name)
            exp = other.exports.get(prop)
            if exp is not None and exp[1] is None:
                found = self._ident(exp[0], other, None, want, seen)
                if found:
                    props.add(found)
        if len(props) == 1:
            return props.pop()
        found = self._by_local_name(prop, want)
        if found:
            return found
        glob = {b.type_name for b in self._global.get(prop, ()) if self._ok(b, want)}
        return glob.pop() if len(glob) == 1 else None

    def _export(self, target: FileScan, exported: str, want: str, seen: set[tuple[str, str]]) -> str | None:
        exp = target.exports.get(exported)
        if exp is not None:
            local, frm = exp
            if frm is not None:
                nxt = self._module(target.path, frm)
                return self._export(nxt, local, want, seen) if nxt is not None else None
            return self._ident(local, target, None, want, seen)
        members = [b for b in target.bindings.get(exported, ()) if b.member and self._ok(b, want)]
        if members:
            return members[-1].type_name
        return self._ident(exported, target, None, want, seen) if exported in target.bindings else None

    def _module(self, importer: str, spec: str) -> FileScan | None:
        if not spec.startswith("."):
            return None
        base = posixpath.normpath(posixpath.join(posixpath.dirname(importer), spec))
        for suffix in _MODULE_SUFFIXES:
            found = self.scans.get(base + suffix)
            if found is not None:
                return found
        return None

    def runtime_syntax(self, scan: FileScan, runtime: str | None, pos: int) -> str | None:
        """"proto2"/"proto3" of the runtime object a definition called, also when imported from a chunk."""
        found = syntax_of(scan, runtime, pos)
        if found or not runtime or "." in runtime:
            return found
        seen: set[tuple[str, str]] = set()
        name, where = runtime, scan
        while (where.path, name) not in seen:
            seen.add((where.path, name))
            imp = where.imports.get(name)
            if imp is None:
                return None
            target = self._module(where.path, imp[0])
            if target is None:
                return None
            exp = target.exports.get(imp[1])
            local = exp[0] if exp is not None else imp[1]
            cands = target.runtimes.get(local)
            if cands:
                return cands[-1][1]
            name, where = local, target
        return None

    def _by_local_name(self, name: str, want: str) -> str | None:
        fulls = [f for f in self._local.get(name, ()) if self.kinds.get(f) == want]
        return fulls[0] if len(fulls) == 1 else None
