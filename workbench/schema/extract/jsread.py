"""Read JavaScript literals and small expressions at a position of a (minified) bundle.

Generated protobuf-es code hands its schema to the runtime as object and array literals
(``{no:1,name:"x",kind:"scalar",T:9}``), references to other types (``T:xe``,
``T:a.getEnumType(Lo)``) and a few well-known expressions (``!0``, ``new Uint8Array([…])``,
``p.parse("5")``). This module reads exactly those into Python values, and skips whatever else
an expression holds (up to the next ``,`` / closing bracket at its depth) as ``Opaque``, so one odd
property never loses the rest. A JavaScript parser would do more than this needs, and the ones on
PyPI are either pure Python (≈0.5 MB/s, no ES2022 class fields) or build a syntax tree of several
GB for a 50 MB bundle (see docs/schema.md).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any


class JsSyntax(Exception):
    """Unreadable input at ``pos`` (e.g. a bundle cut in the middle of a literal)."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.pos = pos


@dataclass(frozen=True, slots=True)
class Ref:
    """An identifier or member chain (``xe``, ``o.Foo``), resolved to a type later."""

    path: str
    pos: int


@dataclass(frozen=True, slots=True)
class Call:
    """``callee(args…)``; ``new X(…)`` has callee ``"new X"``."""

    callee: str
    args: tuple[Any, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Opaque:
    """An expression this reader does not interpret (kept for error messages: its first characters)."""

    text: str
    pos: int


OPAQUE_TEXT = 80   # characters of an uninterpreted expression kept: a function body can be megabytes


def opaque(s: str, start: int, end: int) -> Opaque:
    """``s[start:end]`` as an ``Opaque``, without copying more than ``OPAQUE_TEXT`` characters of it."""
    return Opaque(s[start:min(end, start + OPAQUE_TEXT)], start)


_WS = re.compile(r"(?:\s+|/\*.*?\*/|//[^\n]*)*", re.S)
_IDENT = re.compile(r"[A-Za-z_$\x80-\uffff][\w$\x80-\uffff]*")
_NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)"
                     r"(?:[eE][+-]?\d+)?)n?")
_SIMPLE_STR = {'"': re.compile(r'"([^"\\\n]*)"'), "'": re.compile(r"'([^'\\\n]*)'")}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
_REGEX_BEFORE = set("(,=:[!&|?{};+-*%<>~^")


def skip_ws(s: str, i: int) -> int:
    return _WS.match(s, i).end()  # type: ignore[union-attr]


def read_string(s: str, i: int) -> tuple[str, int]:
    """The string literal at ``s[i]`` (a quote) and the position after it."""
    q = s[i]
    fast = _SIMPLE_STR.get(q)
    if fast is not None:
        m = fast.match(s, i)
        if m:
            return m.group(1), m.end()
    out: list[str] = []
    j = i + 1
    n = len(s)
    while j < n:
        c = s[j]
        if c == q:
            text = "".join(out)
            if any("\ud800" <= ch <= "\udfff" for ch in text):  # JS strings are UTF-16: join \u pairs
                text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
            return text, j + 1
        if c == "\\":
            j += 1
            if j >= n:
                break
            e = s[j]
            if e in _ESCAPES and not (e == "0" and j + 1 < n and s[j + 1].isdigit()):
                out.append(_ESCAPES[e])
            elif e == "x":
                out.append(chr(int(s[j + 1:j + 3], 16)))
                j += 2
            elif e == "u":
                if s[j + 1:j + 2] == "{":
                    end = s.index("}", j)
                    out.append(chr(int(s[j + 2:end], 16)))
                    j = end
                else:
                    out.append(chr(int(s[j + 1:j + 5], 16)))
                    j += 4
            elif e == "\r" and s[j + 1:j + 2] == "\n":
                j += 1
            elif e in "\n\r\u2028\u2029":
                pass
            else:
                out.append(e)
            j += 1
            continue
        if c == "$" and q == "`" and s[j + 1:j + 2] == "{":
            j = skip_balanced(s, j + 1)
            out.append("${…}")
            continue
        if c == "\n" and q != "`":
            raise JsSyntax("unterminated string literal", i)
        out.append(c)
        j += 1
    raise JsSyntax("unterminated string literal", i)


def skip_balanced(s: str, i: int) -> int:
    """Position after the bracket group starting at ``s[i]`` (``(``, ``[`` or ``{``)."""
    stack = [_CLOSERS[s[i]]]
    j = i + 1
    n = len(s)
    prev = "("
    while j < n:
        c = s[j]
        if c in _LITERAL_STARTS and (past := _skip_literal(s, j, prev)) is not None:
            j, prev = past
            continue
        if c in _CLOSERS:
            stack.append(_CLOSERS[c])
        elif c in ")]}":
            if c != stack[-1]:
                raise JsSyntax(f"unbalanced {c!r}", j)
            stack.pop()
            if not stack:
                return j + 1
        if not c.isspace():
            prev = c
        j += 1
    raise JsSyntax(f"unterminated {s[i]!r} (input ends first)", i)


_LITERAL_STARTS = frozenset("\"'`/")


def _skip_literal(s: str, j: int, prev: str) -> tuple[int, str] | None:
    """Past the string, comment or regex literal at ``s[j]``: (the position after it, the ``prev``
    that follows it), or None when ``s[j]`` starts none (a ``/`` that divides). ``prev`` is the last
    significant character, which tells a regex from a division."""
    if s[j] != "/":
        return read_string(s, j)[1], "a"
    if s[j + 1:j + 2] in ("/", "*"):
        return skip_ws(s, j), prev
    if prev in _REGEX_BEFORE:
        return _skip_regex(s, j), "a"
    return None


def _skip_regex(s: str, i: int) -> int:
    j = i + 1
    n = len(s)
    in_class = False
    while j < n:
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == "\n":
            return i + 1  # not a regex after all: treat the slash as division
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "/":
            j += 1
            while j < n and (s[j].isalnum()):
                j += 1
            return j
        j += 1
    return n


def skip_expression(s: str, i: int) -> int:
    """Position of the ``,`` / closing bracket / ``;`` that ends the expression starting at ``i``."""
    j = i
    n = len(s)
    prev = "("
    while j < n:
        c = s[j]
        if c in ",;)]}":
            return j
        if c in _CLOSERS:
            j = skip_balanced(s, j)
            prev = ")"
            continue
        if c in _LITERAL_STARTS and (past := _skip_literal(s, j, prev)) is not None:
            j, prev = past
            continue
        if not c.isspace():
            prev = c
        j += 1
    raise JsSyntax("expression runs to the end of the input", i)


def read_value(s: str, i: int) -> tuple[Any, int]:
    """The value of the expression at ``i`` and the position after it (whitespace skipped).

    Objects become dicts, arrays lists, ``!0``/``!1`` booleans, ``void 0``/``undefined``/``null``
    None; identifiers and member chains ``Ref``; calls ``Call``; arrow functions and
    ``function(){return …}`` their returned value; anything else ``Opaque``.
    """
    start = i = skip_ws(s, i)
    value, i = _primary(s, i)
    i = skip_ws(s, i)
    if i < len(s) and s[i] not in ",;)]}:":
        # a binary/ternary expression or similar: not ours to evaluate
        end = skip_expression(s, i)
        return opaque(s, start, end), end
    return value, i


def _primary(s: str, i: int) -> tuple[Any, int]:
    if i >= len(s):
        raise JsSyntax("input ends where a value was expected", i)
    c = s[i]
    if c in "\"'`":
        return read_string(s, i)
    if c == "{":
        return _object(s, i)
    if c == "[":
        return _array(s, i)
    if c == "(":
        return _paren(s, i)
    if c == "!":
        j = skip_ws(s, i + 1)
        if s[j:j + 1] in ("0", "1") and not s[j + 1:j + 2].isdigit():
            return s[j] == "0", j + 1
        end = skip_expression(s, i)
        return opaque(s, i, end), end
    if c == "-" or c == "+":
        v, j = _primary(s, skip_ws(s, i + 1))
        if isinstance(v, int | float) and not isinstance(v, bool):
            return (-v if c == "-" else v), j
        return opaque(s, i, j), j
    m = _NUMBER.match(s, i)
    if m and (c.isdigit() or c == "."):
        return _number(m.group(0)), m.end()
    m = _IDENT.match(s, i)
    if not m:
        raise JsSyntax(f"unexpected {c!r}", i)
    word = m.group(0)
    j = m.end()
    if word == "true" or word == "false":
        return word == "true", j
    if word in ("null", "undefined"):
        return None, j
    if word == "void":
        k = skip_ws(s, j)
        v, k = _primary(s, k)
        return None, k
    if word == "new":
        k = skip_ws(s, j)
        mm = _IDENT.match(s, k)
        if not mm:
            end = skip_expression(s, i)
            return opaque(s, i, end), end
        callee, k = _member_chain(s, mm.end(), mm.group(0))
        k = skip_ws(s, k)
        args: tuple[Any, ...] = ()
        if s[k:k + 1] == "(":
            args, k = read_args(s, k)
        return Call("new " + callee, args, i), k
    if word == "function":
        return _function(s, i, j)
    k = skip_ws(s, j)
    if s[k:k + 2] == "=>":
        return _arrow_body(s, skip_ws(s, k + 2))
    path, j = _member_chain(s, j, word)
    k = skip_ws(s, j)
    if s[k:k + 1] == "(":
        args, k = read_args(s, k)
        return Call(path, args, i), k
    return Ref(path, i), j


def _number(text: str) -> int | float:
    t = text.replace("_", "").rstrip("n")
    low = t.lower()
    if low.startswith(("0x", "0o", "0b")):
        return int(t, 0)
    if any(ch in low for ch in ".e"):
        f = float(t)
        return int(f) if f.is_integer() and "e" not in low and abs(f) < 2**53 else f
    return int(t)


def _member_chain(s: str, j: int, path: str) -> tuple[str, int]:
    while True:
        k = skip_ws(s, j)
        if s[k:k + 1] == "." and s[k + 1:k + 2] != ".":
            m = _IDENT.match(s, skip_ws(s, k + 1))
            if not m:
                return path, j
            path += "." + m.group(0)
            j = m.end()
        elif s[k:k + 2] == "?." and not s[k + 2:k + 3].isdigit():
            m = _IDENT.match(s, skip_ws(s, k + 2))
            if not m:
                return path, j
            path += "." + m.group(0)
            j = m.end()
        else:
            return path, j


def read_args(s: str, i: int) -> tuple[tuple[Any, ...], int]:
    """The arguments of the call whose ``(`` is at ``s[i]``, and the position after ``)``."""
    items, j = _list(s, i, ")")
    return tuple(items), j


def _array(s: str, i: int) -> tuple[list[Any], int]:
    return _list(s, i, "]")


def _list(s: str, i: int, close: str) -> tuple[list[Any], int]:
    out: list[Any] = []
    j = skip_ws(s, i + 1)
    while True:
        if j >= len(s):
            raise JsSyntax(f"unterminated {s[i]!r} (input ends first)", i)
        c = s[j]
        if c == close:
            return out, j + 1
        if c == ",":  # hole
            out.append(None)
            j = skip_ws(s, j + 1)
            continue
        if s.startswith("...", j):
            end = skip_expression(s, j)
            out.append(opaque(s, j, end))
            j = end
        else:
            v, j = read_value(s, j)
            out.append(v)
        j = skip_ws(s, j)
        if j >= len(s):
            raise JsSyntax(f"unterminated {s[i]!r} (input ends first)", i)
        if s[j] == ",":
            j = skip_ws(s, j + 1)
        elif s[j] != close:
            raise JsSyntax(f"expected ',' or {close!r}", j)


def _object(s: str, i: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    j = skip_ws(s, i + 1)
    n = len(s)
    while True:
        if j >= n:
            raise JsSyntax("unterminated '{' (input ends first)", i)
        c = s[j]
        if c == "}":
            return out, j + 1
        if s.startswith("...", j):
            j = skip_expression(s, j)
        else:
            if c in "\"'":
                key, j = read_string(s, j)
            elif c == "[":
                j = skip_balanced(s, j)
                key = ""
            else:
                m = _IDENT.match(s, j) or _NUMBER.match(s, j)
                if not m:
                    raise JsSyntax(f"unexpected {c!r} in an object literal", j)
                key = m.group(0)
                j = m.end()
            j = skip_ws(s, j)
            c = s[j:j + 1]
            if c == ":":
                v, j = read_value(s, j + 1)
                out[key] = v
            elif c in (",", "}"):
                out[key] = Ref(key, j)  # shorthand property
            elif c == "(" or (key in ("get", "set", "async", "static") and c):
                # a method: skip its parameters and body
                j = skip_expression(s, j)
            else:
                raise JsSyntax(f"unexpected {c!r} after property {key!r}", j)
        j = skip_ws(s, j)
        if j >= n:
            raise JsSyntax("unterminated '{' (input ends first)", i)
        if s[j] == ",":
            j = skip_ws(s, j + 1)
        elif s[j] != "}":
            raise JsSyntax("expected ',' or '}' in an object literal", j)


def _paren(s: str, i: int) -> tuple[Any, int]:
    end = skip_balanced(s, i)
    k = skip_ws(s, end)
    if s[k:k + 2] == "=>":
        return _arrow_body(s, skip_ws(s, k + 2))
    items, j = _list(s, i, ")")
    if len(items) == 0:
        return Opaque("()", i), j
    return items[-1], j  # (a, b) is a sequence: its value is the last one


def _arrow_body(s: str, i: int) -> tuple[Any, int]:
    if s[i:i + 1] == "{":
        return _block_return(s, i)
    return read_value(s, i)


def _function(s: str, start: int, j: int) -> tuple[Any, int]:
    k = skip_ws(s, j)
    m = _IDENT.match(s, k)
    if m:
        k = skip_ws(s, m.end())
    if s[k:k + 1] != "(":
        raise JsSyntax("malformed function expression", start)
    k = skip_ws(s, skip_balanced(s, k))
    if s[k:k + 1] != "{":
        raise JsSyntax("malformed function expression", start)
    return _block_return(s, k)


def _block_return(s: str, i: int) -> tuple[Any, int]:
    """``{return X}`` → X; any other block → Opaque."""
    end = skip_balanced(s, i)
    k = skip_ws(s, i + 1)
    if s.startswith("return", k) and not (_IDENT.match(s, k + 6) and s[k + 6:k + 7] not in "(["):
        try:
            v, j = read_value(s, k + 6)
            j = skip_ws(s, j)
            if s[j:j + 1] == ";":
                j = skip_ws(s, j + 1)
            if j == end - 1:
                return v, end
        except JsSyntax:
            pass
    return opaque(s, i, end), end


# A brace, a quoted string (skipped whole by the regex engine), a template literal's backquote, or a
# slash (comment, regex literal or division). Everything else is skipped in C.
_BLOCK_TOKEN = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[{}`/]""")
_WORD_BEFORE_REGEX = re.compile(r"(?<![\w$])(?:return|typeof|case|do|else|in|of|void|throw|delete|yield|await)$")


class Blocks:
    """The ``{}`` blocks of a file: which block encloses a position (a declaration's scope).

    Built in one pass that skips strings, template literals, comments and regex literals, so the
    braces counted are code. Object literals count as blocks too, which is harmless: a binding is
    never declared directly inside one. An unclosed block (a truncated file) runs to the end.
    """

    def __init__(self, s: str) -> None:
        self.size = len(s)
        # machine-integer arrays, not lists: a 100 MB bundle has millions of braces, and a list holds
        # each position as a Python int (36 bytes) where an array holds 8
        self.starts = array("q")     # block b opens at starts[b]
        self.ends = array("q")       # … and closes at ends[b]
        self._tok = array("q")       # brace positions, in order
        self._inner = array("q")     # innermost open block after each brace (-1: none)
        stack: list[int] = []
        pos = 0
        n = len(s)
        finder = _BLOCK_TOKEN.search
        while True:
            m = finder(s, pos)
            if m is None:
                break
            j = m.start()
            c = s[j]
            pos = m.end()
            if c == "{":
                stack.append(len(self.starts))
                self.starts.append(j)
                self.ends.append(n)
            elif c == "}":
                if stack:
                    self.ends[stack.pop()] = j
            elif c == "`":
                try:
                    pos = read_string(s, j)[1]
                except JsSyntax:
                    break
                continue
            elif c == "/":
                nxt = s[j + 1:j + 2]
                if nxt == "/" or nxt == "*":
                    pos = skip_ws(s, j)
                    continue
                k = j - 1
                while k >= 0 and s[k] in " \t\r\n":
                    k -= 1
                if k < 0 or s[k] in _REGEX_BEFORE or _WORD_BEFORE_REGEX.search(s, max(0, k - 7), k + 1):
                    pos = _skip_regex(s, j)
                continue
            else:
                continue  # a string literal
            self._tok.append(j)
            self._inner.append(stack[-1] if stack else -1)

    def enclosing(self, pos: int) -> tuple[int, int]:
        """(start, end) of the innermost block around ``pos``; (0, size) at the top level."""
        k = bisect_right(self._tok, pos) - 1
        b = self._inner[k] if k >= 0 else -1
        return (self.starts[b], self.ends[b]) if b >= 0 else (0, self.size)
