"""The one printer: every text a person reads goes through here before it reaches a terminal, the
TUI, the web page, the HTML report or a notebook's printed table.

Captured traffic is written by a remote server and by whatever client is being debugged: a label,
model name, tool name, call id or streamed text can hold ``ESC ] 0 ; … BEL`` (retitle the
terminal), ``ESC [ 2 J`` (clear it), OSC 52 (write the clipboard), a bare ``\\r`` (overwrite the
line) or U+202E (make one tool name read as another). Printed as is, a capture drives the
terminal. Here such characters become visible escapes instead:

- what is escaped: every character whose Unicode category is Cc (C0, DEL, C1), Cf (format: bidi
  overrides and isolates U+202A–U+202E, U+2066–U+2069, marks U+200E/U+200F/U+061C, zero-width
  U+200B–U+200D, U+2060, U+FEFF, soft hyphen, tag characters, …), Cs (lone surrogates), Zl and Zp
  (U+2028, U+2029). The list is written out below (computing it from ``unicodedata`` at import
  would cost every command ~0.1 s); tests/test_textsafe.py checks it against the running Python's
  Unicode database. Ordinary spaces, no-break spaces, combining marks and emoji are left alone.
- how: ``\\n``, ``\\r``, ``\\t``; ``\\xNN`` up to U+00FF (ESC is ``\\x1b``, CSI ``\\x9b``);
  ``\\uNNNN`` up to U+FFFF (``\\u202e``); ``\\UNNNNNNNN`` beyond. The forms Python and C use.
  (A zero-width joiner inside an emoji sequence is escaped too: the printer cannot tell a family
  emoji from a spoofed name, and a debugging tool should rather show one joiner too many.)

Three forms, for three kinds of text:

- ``escape(value)``: a *value* (a cell of a table, a label, a name, an id, an SQL result) shown on
  one line. Newlines and tabs inside it are escaped too, and a backslash is doubled where it would
  otherwise read as one of these escapes (before ``n``, ``r``, ``t``, ``\\``, ``xNN``, ``uNNNN``,
  ``UNNNNNNNN`` or an escaped character), so two different values never print the same:
  ``a<ESC>b`` prints ``a\\x1bb`` while the seven characters ``a\\x1bb`` print ``a\\\\x1bb``. A
  backslash anywhere else (``C:\\Users``) is left as it is, which keeps paths readable.
- ``escape_display(text, layout=...)``: text *already written for display*, which has its own
  escapes: frame summaries (``decode.summary.quote`` doubles their backslashes and escapes their
  quotes and line breaks), messages, ``repr``s. Characters to escape are escaped; backslashes are
  kept, or ``"a\\nb"`` would print as ``"a\\\\nb"``. With ``layout=True`` the newlines and tabs are
  the text's own layout (a multi-line report, an error message) and stay.
- ``escape_json(text)``: a JSON document. The characters to escape become ``\\uNNNN`` escapes
  inside its strings, so the output is still exact JSON and decodes to the same value (JSON's own
  encoder already escapes C0 but leaves DEL, C1, bidi and lone surrogates raw when
  ``ensure_ascii=False``).

Speed: a text with nothing to escape (almost all of them) is returned after one ``str.isprintable``
call, a C loop; the rest go through one compiled regex. ``benchmarks/bench_textsafe.py`` measures
a 1M-cell table.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["UNSAFE_RANGES", "EscapingWriter", "escape", "escape_display", "escape_json", "is_safe",
           "json_stream", "block_stream", "rich_text"]

# Every code point of category Cc, Cf, Cs, Zl or Zp in Unicode 14–15.1 (Python 3.11–3.13), as
# inclusive ranges. Tab and newline (Cc) are in it: each form decides about them.
UNSAFE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD),
    (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F),
    (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xD800, 0xDFFF), (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)


def _char_class(skip: str) -> str:
    parts = []
    for lo, hi in UNSAFE_RANGES:
        for a, b in _split_around(lo, hi, [ord(c) for c in skip]):
            parts.append(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}")
    return "[" + "".join(parts) + "]"


def _split_around(lo: int, hi: int, holes: list[int]) -> list[tuple[int, int]]:
    out, start = [], lo
    for h in sorted(holes):
        if start <= h <= hi:
            if start < h:
                out.append((start, h - 1))
            start = h + 1
    if start <= hi:
        out.append((start, hi))
    return out


_UNSAFE = _char_class("")             # the one-line forms: tab and newline too
_UNSAFE_BLOCK = _char_class("\t\n")   # a block's own layout stays
# A backslash that the reader could take for the start of an escape (see escape()).
_AMBIGUOUS_BACKSLASH = (r"\\(?=[\\nrt]|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|" + _UNSAFE + ")")


# Compiled on first use, not at import: ``workbench decode`` and ``sessions`` start in tens of
# milliseconds and most runs never meet a character to escape.
@functools.cache
def _pattern(which: str) -> re.Pattern[str]:
    return re.compile({"value": _UNSAFE + "|" + _AMBIGUOUS_BACKSLASH, "line": _UNSAFE,
                       "block": _UNSAFE_BLOCK}[which])


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escaped(m: re.Match[str]) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    n = ord(c)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def _json_escaped(m: re.Match[str]) -> str:
    n = ord(m.group())
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    n -= 0x10000  # JSON writes a character past the BMP as its UTF-16 surrogate pair
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def escape(value: object) -> str:
    """``value`` as one line a person can read safely, unambiguous (see the module's docstring).

    ``None`` is the empty string; anything else is ``str(value)`` first."""
    if value is None:
        return ""
    text = value if type(value) is str else str(value)
    # the fast path: isprintable() is False for every character the patterns match (and for a few
    # they do not, like a no-break space: those take the regex and come out unchanged)
    if text.isprintable() and "\\" not in text:
        return text
    return _pattern("value").sub(_escaped, text)


def escape_display(text: str, layout: bool = False) -> str:
    """``text``, already written for display, with the characters to escape escaped and its
    backslashes kept; ``layout=True`` keeps its newlines and tabs (a multi-line message)."""
    if text.isprintable():
        return text
    return _pattern("block" if layout else "line").sub(_escaped, text)


def escape_json(text: str) -> str:
    """A JSON document with the characters to escape written as ``\\uNNNN``: the same JSON value.

    Raw characters to escape can only sit inside JSON strings (JSON allows no others outside them
    but whitespace, which is left), where ``\\uNNNN`` means the same character."""
    if text.isprintable():
        return text
    return _pattern("block").sub(_json_escaped, text)


def is_safe(text: str, layout: bool = True) -> bool:
    """True when ``text`` holds no character to escape (``layout``: newlines and tabs allowed)."""
    return _pattern("block" if layout else "line").search(text) is None


class EscapingWriter(io.TextIOBase):
    """A text stream that passes what is written through one of the forms above to ``out``: for
    writers that take a stream (a JSON encoder writing a big frame in pieces, a report printer).
    Each character is escaped on its own, so pieces may be cut anywhere."""

    def __init__(self, out: TextIO, form: Callable[[str], str]) -> None:
        super().__init__()
        self._out = out
        self._form = form

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._out.write(self._form(text))
        return len(text)

    def flush(self) -> None:
        self._out.flush()


def json_stream(out: TextIO) -> TextIO:
    """``out`` for a JSON document written in pieces (``escape_json`` on each)."""
    return EscapingWriter(out, escape_json)  # type: ignore[return-value]  # a TextIOBase is a TextIO


def block_stream(out: TextIO) -> TextIO:
    """``out`` for text written for display whose newlines and tabs are its layout."""
    return EscapingWriter(out, lambda text: escape_display(text, layout=True))  # type: ignore[return-value]


def rich_text(value: object, style: str = "", *, display: bool = False, **kwargs: object) -> Any:
    """``value`` as a Rich ``Text`` for the TUI and the web page (the same app): escaped like
    ``escape`` (``display=True``: like ``escape_display``), and never read as markup, so a tool
    name holding ``[red]`` or ``[link=…]`` is shown as those characters. Textual renders a plain
    ``str`` cell as markup: captured text goes into a table through this.

    Rich strips a few control characters (BEL, CR, …) from a Text but writes ESC and C1 through
    to the terminal; the escapes here are what keep them out (and keep names from spoofing)."""
    from rich.text import Text  # only the TUI loads Rich

    shown = escape_display(str(value)) if display and value is not None else escape(value)
    return Text(shown, style, **kwargs)  # type: ignore[arg-type]  # Text's keyword arguments
