"""``workbench/schema/pb.pyi``: the typed view of ``pb`` is current, matches the runtime classes, and
makes mypy catch a misspelt field."""

from __future__ import annotations

import keyword
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.schema import pb
from workbench.schema.stubgen import STUB, render

ROOT = Path(__file__).resolve().parents[2]


def test_stub_is_up_to_date_with_the_overlay() -> None:
    assert STUB.read_text() == render(), (
        "workbench/schema/pb.pyi is out of date with the overlay: run `python -m workbench.schema.stubgen`")


def _top_level_classes(text: str) -> dict[str, set[str]]:
    """Public top-level classes of the stub and the field names declared directly in each."""
    out: dict[str, set[str]] = {}
    current: set[str] | None = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"class (\w+)\(_Message\):", line)
        if m:
            current = out.setdefault(m.group(1), set()) if not m.group(1).startswith("_") else None
            continue
        if current is None or not line.startswith("    ") or line.startswith("     "):
            continue
        attr = re.match(r"    (\w+): (?!ClassVar)", line)
        prop = re.match(r"    def (\w+)\(self\) -> ", line)
        if attr:
            current.add(attr.group(1))
        elif prop and lines[i - 1] == "    @property":
            current.add(prop.group(1))
    return out


def test_every_class_is_what_pb_returns_with_the_same_fields() -> None:
    classes = _top_level_classes(STUB.read_text())
    assert {"AgentServerMessage", "AgentClientMessage", "BidiAppendRequest", "Value"} <= set(classes)
    for name, fields in classes.items():
        desc = getattr(pb, name).DESCRIPTOR
        nested = {n.name for n in desc.nested_types} | {e.name for e in desc.enum_types}
        want = {f.name for f in desc.fields if not keyword.iskeyword(f.name) and f.name not in nested}
        assert fields == want, name


@pytest.mark.slow
def test_mypy_checks_field_names_through_pb(tmp_path: Path) -> None:
    snippet = tmp_path / "uses_pb.py"
    snippet.write_text(
        "from workbench.schema import pb\n"
        "m = pb.ShellArgs(command='ls', working_dir='/repo')\n"
        "print(m.comand)\n"
        "e = pb.ExecServerMessage.FromString(b'')\n"
        "print(e.WhichOneof('arg'))\n"
        "ok: str = e.shell_args.command + (e.WhichOneof('args') or '')\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                           str(snippet)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert [int(line.split(":")[1]) for line in errors] == [2, 3, 5], proc.stdout
    assert 'Unexpected keyword argument "working_dir"' in errors[0]
    assert '"ShellArgs" has no attribute "comand"' in errors[1]
    assert "Literal['args']" in errors[2]
