"""``jsread.Blocks``: which ``{}`` block encloses a position, with braces in strings, templates,
comments and regex literals not counted (the extractor's scoping of reused minified names)."""

from __future__ import annotations

from workbench.schema.extract.jsread import Blocks


def _block_of(s: str, marker: str) -> str:
    start, end = Blocks(s).enclosing(s.index(marker))
    return s[start:end + 1] if (start, end) != (0, len(s)) else "<top>"


def test_top_level_and_nested_function_scopes() -> None:
    s = "var a=1;(()=>{var b=2;function f(){var c=3}})();"
    assert _block_of(s, "a=1") == "<top>"
    assert _block_of(s, "b=2") == "{var b=2;function f(){var c=3}}"
    assert _block_of(s, "c=3") == "{var c=3}"


def test_after_a_closed_block_the_parent_encloses() -> None:
    s = "(()=>{if(x){y()}var z=1})();var w=2"
    assert _block_of(s, "z=1") == "{if(x){y()}var z=1}"
    assert _block_of(s, "w=2") == "<top>"


def test_braces_inside_strings_comments_templates_and_regexes_are_not_code() -> None:
    s = ("(()=>{var s=\"}{\",t='}',u=`${ {a:1}.a }}`;/* } */// }\n"
         "var r=/[}]\\}/g,d=a/2/1;var k=1})();var top=1")
    assert _block_of(s, "k=1") == s[s.index("{"):s.rindex("}") + 1]
    assert _block_of(s, "top=1") == "<top>"


def test_an_unclosed_block_runs_to_the_end_of_a_truncated_file() -> None:
    s = "(()=>{var a=class n extends M{static typeName=\"x.Y\""
    start, end = Blocks(s).enclosing(s.index("var a"))
    assert (start, end) == (s.index("{"), len(s))
