"""Tool-call arguments filled from a tool's JSON schema, as a model would write them.

When the simulated model calls a tool the client offered (an MCP tool, a tool of an OpenAI client
behind a bridge), its arguments follow that tool's ``input_schema``: every required property is
there, each value has the property's type and a plausible value for the words of its name (a ``path``
or ``file_path`` gets a file path, ``content`` some text, ``command`` a shell command, ``city`` a city), enums pick one of
their values, arrays and objects are filled recursively. The scenario's own arguments are kept
where a property of that name (or a known synonym) takes them. Never the same string in every
field: a ``get_weather(city)`` tool gets a city, not the scenario's shell command. What the scenario's
call is about and no property took by name goes, once, into a free-text property (``text``,
``input``, ``query``, …): an ``echo(text)`` tool gets the grep's pattern, not a fixed phrase every time.

Bounded: recursion stops at depth ``MAX_DEPTH`` and arrays get ``minItems`` (at least one, at most
``MAX_ITEMS``) elements, whatever the schema says.
"""

from __future__ import annotations

import re
from typing import Any

from workbench.jsontypes import JsonObject

MAX_DEPTH = 6
MAX_ITEMS = 3

# property-name hints → a plausible string; the first hint contained in the name wins
_STRING_BY_NAME: tuple[tuple[tuple[str, ...], str], ...] = (
    (("command", "cmd", "script", "shell", "bash"), "ls -la"),
    (("url", "uri", "link", "href", "endpoint"), "https://example.com/docs"),
    (("email",), "dev@example.com"),
    (("dir", "directory", "folder", "cwd", "workdir", "root"), "src"),
    (("path", "file", "filename", "filepath"), "src/main.py"),
    (("pattern", "regex", "glob"), "TODO"),
    (("query", "search", "term", "keyword", "question", "prompt"), "how the workbench simulator works"),
    (("city", "location", "place", "town"), "Berlin"),
    (("country",), "Germany"),
    (("language", "lang", "locale"), "en"),
    (("date", "day"), "2026-01-15"),
    (("time", "timestamp"), "2026-01-15T10:00:00Z"),
    (("unit",), "celsius"),
    (("title", "subject", "heading"), "Simulated change"),
    (("description", "summary", "explanation", "reason"), "A short description of the change."),
    (("comment", "note", "message", "feedback"), "Looks good; one small note."),
    (("content", "contents", "text", "body", "input", "code", "data", "value"),
     "Hello from the workbench simulator.\n"),
    (("name", "label", "tag", "key"), "example"),
    (("id", "uuid", "ref", "token"), "item-1"),
    (("model",), "default"),
)
# scenario argument names a schema property of another name still takes
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "command": ("cmd", "script", "shell_command"),
    "path": ("file_path", "filepath", "file", "filename", "target_file", "target"),
    "pattern": ("query", "regex", "search"),
    "file_text": ("content", "contents", "text"),
    "contents": ("content", "file_text", "text"),
    "content": ("contents", "file_text", "text"),
}
# property-name words of free text, which can carry whatever the call is about
_FREE_TEXT = {"text", "input", "message", "query", "prompt", "content", "contents", "value", "data", "body",
              "args", "arguments", "request", "instruction", "instructions", "task"}
_FORMATS = {"uri": "https://example.com/docs", "url": "https://example.com/docs", "email": "dev@example.com",
            "date": "2026-01-15", "date-time": "2026-01-15T10:00:00Z", "time": "10:00:00",
            "uuid": "123e4567-e89b-42d3-a456-426614174000", "hostname": "example.com", "ipv4": "127.0.0.1"}


def fill_args(schema: JsonObject, given: JsonObject) -> JsonObject:
    """Arguments for a tool with JSON schema ``schema``: ``given`` (the scenario's) where they fit,
    plausible values for the rest of the required properties. An object schema without properties
    gets ``given`` unchanged."""
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return dict(given)
    out: JsonObject = {}
    used: set[str] = set()
    for name, prop in props.items():
        key = _given_key(name, given)
        if key is not None and _fits(given[key], prop):
            out[name] = given[key]
            used.add(key)
    # What the scenario means to say and no property took by name (a command, a pattern) goes into
    # a free-text property, once: an echo(text) tool gets "TODO" for a grep, "." for an ls.
    leftovers = [v for k, v in given.items() if k not in used and isinstance(v, str) and v]
    for name in _required(schema):
        if name in out or name not in props:
            continue
        prop = props[name]
        if leftovers and _words(name) & _FREE_TEXT and _fits(leftovers[0], prop):
            out[name] = leftovers.pop(0)
        else:
            out[name] = value_for(prop, name, 1)
    return out


def value_for(schema: Any, name: str = "", depth: int = 0) -> Any:
    """A plausible value of ``schema`` for a property called ``name``."""
    if not isinstance(schema, dict):
        return _string_for(name)
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for combo in ("anyOf", "oneOf", "allOf"):
        options = schema.get(combo)
        if isinstance(options, list) and options:
            typed = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            return value_for(typed[0] if typed else options[0], name, depth)
    typ = _type_of(schema)
    if typ == "boolean":
        return True
    if typ in ("integer", "number"):
        return _number_for(schema, name, typ)
    if typ == "array":
        if depth >= MAX_DEPTH:
            return []
        n = min(MAX_ITEMS, max(1, int(schema.get("minItems", 1) or 1)))
        item_name = name[:-1] if name.endswith("s") else name
        return [value_for(schema.get("items", {}), item_name, depth + 1) for _ in range(n)]
    if typ == "object":
        if depth >= MAX_DEPTH:
            return {}
        props = schema.get("properties")
        if not isinstance(props, dict):
            return {}
        return {k: value_for(props[k], k, depth + 1) for k in _required(schema) if k in props}
    if typ == "null":
        return None
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    return _string_for(name, schema)


def _required(schema: JsonObject) -> list[str]:
    req = schema.get("required")
    return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []


def _type_of(schema: JsonObject) -> str:
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), typ[0] if typ else None)
    if isinstance(typ, str):
        return typ
    if isinstance(schema.get("properties"), dict):
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _words(name: str) -> set[str]:
    """The words of a property name (snake_case, camelCase, kebab-case), lower-cased."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w}


def _number_for(schema: JsonObject, name: str, typ: str) -> int | float:
    words = _words(name)
    value: float = 10 if words & {"limit", "max", "count", "top", "size", "lines", "results"} else 1
    if words & {"temperature", "ratio", "probability"}:
        value = 0.5
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if isinstance(lo, int | float) and value < lo:
        value = lo
    if isinstance(hi, int | float) and value > hi:
        value = hi
    return int(value) if typ == "integer" else value


def _string_for(name: str, schema: JsonObject | None = None) -> str:
    words = _words(name)
    text = next((v for hints, v in _STRING_BY_NAME if words & set(hints)), None)
    if text is None:
        text = f"example {name}" if name else "example"
    if schema is not None:
        most = schema.get("maxLength")
        least = schema.get("minLength")
        if isinstance(most, int) and len(text) > most:
            text = text[:most]
        if isinstance(least, int) and len(text) < least:
            text = text.ljust(least, "x")
    return text


def _given_key(name: str, given: JsonObject) -> str | None:
    """The scenario's argument for property ``name``: the same name (any case or separator), a known
    synonym (``path`` for ``file_path``/``filePath``), or a name that is one of the property's words."""
    if name in given:
        return name
    flat = _flat(name)
    by_flat = {_flat(k): k for k in given}
    if flat in by_flat:
        return by_flat[flat]
    for source, aliases in _SYNONYMS.items():
        if flat in {_flat(a) for a in aliases} and _flat(source) in by_flat:
            return by_flat[_flat(source)]
    words = _words(name)
    return next((k for k in given if _flat(k) in words), None)


def _flat(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _fits(value: Any, schema: Any) -> bool:
    """Does ``value`` have the property's JSON type (and, for an enum, one of its values)?"""
    if not isinstance(schema, dict):
        return True
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and value not in enum:
        return False
    if not any(k in schema for k in ("type", "properties", "items")):
        return True
    typ = _type_of(schema)
    checks = {"string": isinstance(value, str), "boolean": isinstance(value, bool),
              "integer": isinstance(value, int) and not isinstance(value, bool),
              "number": isinstance(value, int | float) and not isinstance(value, bool),
              "array": isinstance(value, list), "object": isinstance(value, dict), "null": value is None}
    return checks.get(typ, True)
