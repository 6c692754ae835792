"""Find protobuf-es v1 definitions in one JavaScript file, whatever the minifier renamed.

v1 hands its schema to the runtime in calls and class statics whose *property* names survive
minification (only variables are renamed), so these are the anchors:

* ``X.makeMessageType("pkg.Name", () => [fields…])`` and ``X.makeEnum("pkg.E", [values…])``
  (``target=js``), bound to a variable (``const a = …``) or an export (``exports.a = …``);
* classes (``target=ts`` compiled): ``static typeName = "pkg.Name"`` / ``this.typeName = …`` in a
  ``static {}`` block / ``Y.typeName = …`` / ``__publicField(Y, "typeName", …)``, each followed by
  ``fields … newFieldList(() => [fields…])``; the class is bound as ``var a = class n extends …``
  (``n`` is only visible inside the class) or ``class a extends …``;
* ``X.util.setEnumType(E, "pkg.E", [values…])`` for TypeScript enums;
* connect-es service objects ``{typeName: "pkg.Svc", methods: {…}}``;
* the runtime objects ``X = f("proto3", …)`` (to tell proto2 from proto3 code), ESM
  ``import``/``export`` clauses and ``name: () => local`` export getters (to follow references
  across chunks), and ``var alias = Class`` right after a lowered class.

A field's ``T`` is kept as a reference (``jsread.Ref``) and resolved by ``resolve.py`` once every
file has been scanned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from workbench.schema.extract.jsread import (
    Blocks,
    Call,
    JsSyntax,
    Opaque,
    Ref,
    read_args,
    read_string,
    read_value,
    skip_ws,
)

# Every pattern starts with a literal so the regex engine can skip ahead quickly; what comes before
# the literal is checked by a second pattern on a short window.
_MAKE = re.compile(r"\.(makeMessageType|makeEnum)\s*\(\s*")
_SET_ENUM = re.compile(r"\.setEnumType\s*\(\s*")
_EXTENSION = re.compile(r"\.makeExtension\s*\(\s*(?=[\"'])")
_TYPENAME = re.compile(r"typeName(?:[\"']\s*,|\s*=(?![=>]))\s*(?=[\"'])")
_TYPENAME_BEFORE = re.compile(
    r"""(?:\bstatic\s+(?:readonly\s+)?|\bthis\s*\.\s*|(?<![\w$.])([\w$]+)\s*\.\s*"""
    r"""|(?<![\w$.])[\w$]+\(\s*([\w$]+)\s*,\s*["'])$""")
_FIELDS = re.compile(r"""fields["']?\s*[=,]\s*(?:\(\s*0\s*,\s*)?([\w$.]*?)\.?(?:util\.)?newFieldList\)?\s*\(""")
_SERVICE = re.compile(r"""typeName\s*:\s*(?=["'][\w.]+["']\s*,\s*methods\s*:)""")
_RUNTIME = re.compile(r"""proto([23])(["'])\s*,""")
_RUNTIME_BEFORE = re.compile(r"""(?<![\w$.])([\w$]+)\s*=\s*(?:/\*[^*]*\*/\s*)?[\w$.]+\(\s*$""")
_LHS = re.compile(r"(?<![\w$.])([\w$]+(?:\.[\w$]+)*)\s*=\s*(?:/\*[^*]*\*/\s*)?(?:\(\s*)?$")
_CALLEE = re.compile(r"([\w$]+(?:\s*\.\s*[\w$]+)*)\s*$")
_CLASS = re.compile(r"(?<![\w$])class(?:\s+([\w$]+))?\s+extends\b")
_GETTER = re.compile(r"""([\w$]+|"[^"\n]{1,200}"|'[^'\n]{1,200}')\s*:\s*(?:\(\)\s*=>\s*|function\s*\(\)\s*\{\s*return\s+)$""")
_GETTER_TAIL = re.compile(r""":\s*(?:\(\)\s*=>|function\s*\(\)\s*\{\s*return\s)\s*([\w$]+)""")
_EXPORT = re.compile(r"""export\s*\{([^{}]*)\}(?:\s*from\s*(["'])([^"']+)\2)?""")
_IMPORT = re.compile(r"""import\s*(?:([\w$]+)\s*,?\s*)?(?:\{([^{}]*)\}|\*\s*as\s+([\w$]+))\s*from\s*(["'])([^"']+)\4""")
_REQUIRE = re.compile(r"""require\(\s*(["'])([^"']+)\1\s*\)""")
_REQUIRE_BEFORE = re.compile(r"""(?<![\w$.])([\w$]+)\s*=\s*(?:[\w$]+\()?$""")
_TYPE_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_CLASS_WINDOW = 60000
_FIELDS_WINDOW = 600


@dataclass
class Binding:
    """A name that holds a message class or enum object (``member``: bound as ``obj.name``)."""

    name: str
    type_name: str
    pos: int
    scope: tuple[int, int] | None = None
    member: bool = False
    block: tuple[int, int] | None = None  # the ``{}`` block it is declared in; None: not computed


@dataclass
class Found:
    """One message, enum or service found in a file."""

    kind: str  # "message" | "enum" | "service"
    type_name: str
    pos: int
    runtime: str | None  # callee path of the runtime object (syntax is looked up from it)
    body: Any  # fields list / values list / methods dict
    shape: str  # "makeMessageType", "class", "makeEnum", "setEnumType", "connect"


@dataclass
class FileScan:
    path: str
    size: int
    found: list[Found] = field(default_factory=list)
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    runtimes: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # var → [(pos, "proto3")]
    exports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # exported → (local, from)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local → (module, exported)
    namespaces: dict[str, str] = field(default_factory=dict)  # local → module (import * / require)
    errors: list[tuple[int, str]] = field(default_factory=list)

    def bind(self, b: Binding) -> None:
        self.bindings.setdefault(b.name, []).append(b)


def scan(path: str, s: str) -> FileScan:
    """Every v1 definition in the text ``s`` of the file ``path``."""
    out = FileScan(path, len(s))
    for m in _RUNTIME.finditer(s):
        q = m.start() - 1
        if q < 0 or s[q] != m.group(2):
            continue
        bm = _RUNTIME_BEFORE.search(s, max(0, q - 120), q)
        if bm:
            out.runtimes.setdefault(bm.group(1), []).append((q, "proto" + m.group(1)))
    for m in _MAKE.finditer(s):
        _make_call(s, m, out)
    for m in _SET_ENUM.finditer(s):
        _set_enum(s, m, out)
    for m in _TYPENAME.finditer(s):
        _class_statics(s, m, out)
    for m in _SERVICE.finditer(s):
        _service(s, m, out)
    for m in _EXTENSION.finditer(s):
        out.errors.append((m.start(), "a protobuf-es v1 extension (makeExtension) is not recovered"))
    if out.found:
        _modules(s, out)
        _declaration_blocks(s, out)
    return out


def _declaration_blocks(s: str, out: FileScan) -> None:
    """Where a short name is bound to different types in one file (separately minified apps or
    module functions in one bundle), note each binding's enclosing block, so that a reference
    resolves to the binding whose scope holds it rather than to the nearest one in the text."""
    reused = [bs for bs in out.bindings.values()
              if len({b.type_name for b in bs if not b.member and b.scope is None}) > 1]
    if not reused:
        return
    blocks = Blocks(s)
    for bs in reused:
        for b in bs:
            if not b.member and b.scope is None:
                b.block = blocks.enclosing(b.pos)


def _callee_before(s: str, end: int) -> str | None:
    m = _CALLEE.search(s, max(0, end - 200), end)
    return re.sub(r"\s+", "", m.group(1)) if m else None


def _lhs_before(s: str, end: int) -> str | None:
    m = _LHS.search(s, max(0, end - 300), end)
    return m.group(1) if m else None


def _bind_lhs(out: FileScan, lhs: str | None, type_name: str, pos: int) -> None:
    if not lhs:
        return
    if "." in lhs:
        out.bind(Binding(lhs.rsplit(".", 1)[1], type_name, pos, member=True))
    else:
        out.bind(Binding(lhs, type_name, pos))


def _make_call(s: str, m: re.Match[str], out: FileScan) -> None:
    what = m.group(1)
    i = m.end()
    if s[i:i + 1] not in "\"'":
        return
    try:
        type_name, j = read_string(s, i)
        j = skip_ws(s, j)
        if s[j:j + 1] != ",":
            raise JsSyntax(f"expected ',' after the type name in {what}", j)
        body, j = read_value(s, j + 1)
    except JsSyntax as exc:
        out.errors.append((exc.pos, f"{what}({s[i:i + 60]!r}…): {exc}"))
        return
    callee_end = m.start()
    runtime = _callee_before(s, callee_end)
    lhs = _lhs_before(s, callee_end - len(runtime or "")) if runtime else None
    kind = "message" if what == "makeMessageType" else "enum"
    out.found.append(Found(kind, type_name, i, runtime, body, what))
    _bind_lhs(out, lhs, type_name, i)


def _set_enum(s: str, m: re.Match[str], out: FileScan) -> None:
    paren = s.index("(", m.start())
    try:
        items, _ = read_args(s, paren)
    except JsSyntax as exc:
        out.errors.append((exc.pos, f"setEnumType(…): {exc}"))
        return
    if len(items) < 3 or not isinstance(items[1], str):
        return
    runtime = _callee_before(s, m.start())
    if runtime and runtime.endswith(".util"):
        runtime = runtime[: -len(".util")]
    out.found.append(Found("enum", items[1], m.start(), runtime, items[2], "setEnumType"))
    target = items[0]
    if isinstance(target, Ref):
        _bind_lhs(out, target.path, items[1], target.pos)


def _class_statics(s: str, m: re.Match[str], out: FileScan) -> None:
    i = m.end()
    before = _TYPENAME_BEFORE.search(s, max(0, m.start() - 80), m.start())
    if before is None or (s[m.start() + 8] in "\"'") != bool(before.group(2)):
        return
    try:
        type_name, j = read_string(s, i)
    except JsSyntax as exc:
        out.errors.append((exc.pos, f"typeName: {exc}"))
        return
    if not _TYPE_NAME.fullmatch(type_name):
        return
    fm = _FIELDS.search(s, j, j + _FIELDS_WINDOW)
    if fm is None:
        return  # a typeName that is not a protobuf-es message class
    between = s[j:fm.start()]
    if "typeName" in between or re.search(r"(?<![\w$])class\b", between):
        return  # those fields belong to another class
    runtime = fm.group(1) or None
    if runtime and runtime.endswith(".util"):
        runtime = runtime[: -len(".util")]
    body: Any
    try:
        args, end = read_args(s, fm.end() - 1)
        body = args[0] if args else []
    except JsSyntax as exc:
        out.errors.append((exc.pos, f"{type_name}: fields: {exc}"))
        body, end = Opaque("", fm.end()), fm.end()
    out.found.append(Found("message", type_name, i, runtime, body, "class"))
    owner = before.group(1) or before.group(2)
    if owner and owner != "this":
        out.bind(Binding(owner, type_name, i))
        _alias_after(s, end, owner, type_name, out)
        return
    cm = _enclosing_class(s, before.start())
    if cm is None:
        return
    inner = cm.group(1)
    outer = _lhs_before(s, cm.start())
    if outer:
        _bind_lhs(out, outer, type_name, cm.start())
        if inner and inner != outer:
            out.bind(Binding(inner, type_name, cm.start(), scope=(cm.start(), end)))
    elif inner:
        out.bind(Binding(inner, type_name, cm.start()))
        _alias_after(s, end, inner, type_name, out)


def _enclosing_class(s: str, pos: int) -> re.Match[str] | None:
    k = pos
    low = max(0, pos - _CLASS_WINDOW)
    while True:
        k = s.rfind("class", low, k)
        if k < 0:
            return None
        cm = _CLASS.match(s, k)
        if cm is not None and (k == 0 or not (s[k - 1].isalnum() or s[k - 1] in "_$")):
            return cm


def _alias_after(s: str, end: int, name: str, type_name: str, out: FileScan) -> None:
    """``…));var kd=Br`` right after a lowered class: references then use ``kd``."""
    am = re.compile(r"[)\s;]*(?:,|;|\b(?:var|let|const)\s)\s*(?:(?:var|let|const)\s+)?([\w$]+)\s*=\s*"
                    + re.escape(name) + r"(?![\w$.(])").match(s, end, end + 200)
    if am:
        out.bind(Binding(am.group(1), type_name, am.start(1)))


def _service(s: str, m: re.Match[str], out: FileScan) -> None:
    try:
        type_name, j = read_string(s, m.end())
        j = skip_ws(s, j)
        j = skip_ws(s, j + 1)  # ','
        j = skip_ws(s, s.index(":", j) + 1)
        methods, _ = read_value(s, j)
    except (JsSyntax, ValueError) as exc:
        out.errors.append((getattr(exc, "pos", m.start()), f"service object: {exc}"))
        return
    if isinstance(methods, dict):
        out.found.append(Found("service", type_name, m.start(), None, methods, "connect"))


def _modules(s: str, out: FileScan) -> None:
    """ESM import/export clauses, export getters and ``require`` namespaces of a file."""
    for m in _EXPORT.finditer(s):
        if _word_before(s, m.start()):
            continue
        for part in m.group(1).split(","):
            bits = part.strip().split()
            if not bits:
                continue
            local, exported = (bits[0], bits[2]) if len(bits) == 3 and bits[1] == "as" else (bits[0], bits[0])
            out.exports[exported.strip("\"'")] = (local, m.group(3))
    for m in _IMPORT.finditer(s):
        if _word_before(s, m.start()):
            continue
        module = m.group(5)
        if m.group(3):
            out.namespaces[m.group(3)] = module
        if m.group(2):
            for part in m.group(2).split(","):
                bits = part.strip().split()
                if not bits:
                    continue
                exported, local = (bits[0], bits[2]) if len(bits) == 3 and bits[1] == "as" else (bits[0], bits[0])
                out.imports[local] = (module, exported.strip("\"'"))
    for m in _REQUIRE.finditer(s):
        bm = _REQUIRE_BEFORE.search(s, max(0, m.start() - 80), m.start())
        if bm and not _word_before(s, m.start()):
            out.namespaces[bm.group(1)] = m.group(2)
    known = set(out.bindings)
    for m in _GETTER_TAIL.finditer(s):
        local = m.group(1)
        if local not in known:
            continue
        km = _GETTER.search(s, max(0, m.start() - 210), m.end() - len(local))
        if km:
            out.exports.setdefault(km.group(1).strip("\"'"), (local, None))


def _word_before(s: str, i: int) -> bool:
    return i > 0 and (s[i - 1].isalnum() or s[i - 1] in "_$.")


def syntax_of(scan_: FileScan, runtime: str | None, pos: int) -> str | None:
    """"proto2" / "proto3" of the runtime object a definition called, when it can be told."""
    if not runtime:
        return None
    last = runtime.rsplit(".", 1)[-1]
    if last in ("proto2", "proto3"):
        return last
    cands = scan_.runtimes.get(runtime)
    if not cands:
        return None
    return min(cands, key=lambda c: abs(c[0] - pos))[1]


__all__ = ["Binding", "Call", "FileScan", "Found", "Ref", "scan", "syntax_of"]
