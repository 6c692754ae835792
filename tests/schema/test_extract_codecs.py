"""Property tests of the extraction codecs: protobuf-es base64, embedded descriptors, JS literal reading."""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import descriptor_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.schema.extract import v2
from workbench.schema.extract.jsread import Ref, read_string, read_value


@given(st.binary(max_size=300), st.sampled_from(["std", "std_raw", "url"]), st.integers(0, 5))
def test_base64_like_protobuf_es(data: bytes, encoding: str, spaces: int) -> None:
    text = base64.b64encode(data).decode() if encoding != "url" else base64.urlsafe_b64encode(data).decode()
    if encoding != "std":
        text = text.rstrip("=")
    for _ in range(spaces):  # white-space is ignored anywhere
        i = len(text) // (spaces + 1)
        text = text[:i] + " \n\t"[_ % 3] + text[i:]
    assert v2.b64decode(text) == data


@given(st.binary(min_size=1, max_size=50), st.binary(min_size=1, max_size=50))
def test_base64_inner_padding_concatenates(a: bytes, b: bytes) -> None:
    assert v2.b64decode(base64.b64encode(a).decode() + base64.b64encode(b).decode()) == a + b


_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: "__" not in n)


@st.composite
def _files(draw: Any) -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name=draw(_names) + ".proto", package="p." + draw(_names), syntax="proto3")
    for i in range(draw(st.integers(1, 4))):
        m = fd.message_type.add(name=f"M{i}")
        names = draw(st.lists(_names, min_size=0, max_size=6, unique=True))
        for n, name in enumerate(names, start=1):
            f = m.field.add(name=name, number=n, type=draw(st.sampled_from([1, 3, 8, 9, 12, 13, 17])),
                            label=draw(st.sampled_from([1, 3])))
            f.json_name = draw(st.sampled_from([v2.proto_camel_case(name), "custom" + str(n)]))
    return fd


@settings(max_examples=60)
@given(_files(), st.sampled_from(['"', "'", "`"]))
def test_embedded_descriptor_round_trip(fd: descriptor_pb2.FileDescriptorProto, quote: str) -> None:
    stripped = descriptor_pb2.FileDescriptorProto()
    stripped.CopyFrom(fd)
    for m in stripped.message_type:  # what protobuf-es's embedFileDesc strips
        for f in m.field:
            if f.json_name == v2.proto_camel_case(f.name):
                f.ClearField("json_name")
    b64 = base64.b64encode(stripped.SerializeToString()).decode().rstrip("=")
    js = f'var a=1;export const file_x=/*@__PURE__*/Xe({quote}{b64}{quote},[fe]);const b="Cx";'
    found = v2.scan("x.js", js)
    assert found.errors == []
    assert [e.proto for e in found.files] == [fd]
    assert found.files[0].pos == js.index(quote + b64)


@given(st.text(max_size=80))
def test_read_string_reads_json_escapes(text: str) -> None:
    lit = json.dumps(text)
    assert read_string("x=" + lit + ";", 2) == (text, 2 + len(lit))
    single = "'" + lit[1:-1].replace("'", "\\'").replace('\\"', '"') + "'"
    assert read_string(single, 0)[0] == text


def _js(v: Any) -> str:
    """A value as minified JavaScript source (booleans as !0/!1, references as identifiers)."""
    if v is True:
        return "!0"
    if v is False:
        return "!1"
    if v is None:
        return "void 0"
    if isinstance(v, Ref):
        return v.path
    if isinstance(v, list):
        return "[" + ",".join(_js(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_js(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.text(max_size=10)
    | st.from_regex(r"[a-zA-Z_$][\w$]{0,4}(\.[a-zA-Z_$][\w$]{0,4})?", fullmatch=True)
      .filter(lambda s: s.split(".")[0] not in ("void", "new", "function", "true", "false", "null", "undefined"))
      .map(lambda p: Ref(p, 0)),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.from_regex(r"[a-zA-Z_$][\w$]{0,5}", fullmatch=True), children, max_size=4),
    max_leaves=12)


def _strip_pos(v: Any) -> Any:
    if isinstance(v, Ref):
        return ("ref", v.path)
    if isinstance(v, list):
        return [_strip_pos(x) for x in v]
    if isinstance(v, dict):
        return {k: _strip_pos(x) for k, x in v.items()}
    return v


@given(_values)
def test_read_value_reads_minified_literals(v: Any) -> None:
    src = "()=>(" + _js(v) + ")"  # an object body needs parentheses in JavaScript too
    got, end = read_value(src, 0)
    assert end == len(src)
    assert _strip_pos(got) == _strip_pos(v)
