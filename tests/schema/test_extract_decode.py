"""A session recorded with a renamed/renumbered schema decodes with the schema extracted from its JS.

The "next Cursor build" is our overlay with a message renamed (``ShellArgs`` → ``ShellInvocation``),
fields renumbered (``TextDelta.text`` 1 → 7, ``InteractionUpdate.text_delta`` 1 → 31,
``ShellArgs.command`` 1 → 99) and a field renamed (``working_directory`` → ``cwd``). Its protobuf-es
v1 TypeScript output is bundled and minified, extracted, and handed to ``workbench decode --proto``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from js_generators import Generators
from support import run_workbench

from workbench.schema.loader import BUILTIN_FILES, PROTO_ROOT, compile_protos
from workbench.wire.envelope import encode

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def _next_build(root: Path) -> Path:
    for name in BUILTIN_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((PROTO_ROOT / name).read_text())
    agent = root / "agent/v1/agent.proto"
    text = agent.read_text()
    for old, new in [("message TextDelta {\n  string text = 1;", "message TextDelta {\n  string text = 7;"),
                     ("    TextDelta text_delta = 1;", "    TextDelta text_delta = 31;"),
                     ("message ShellArgs {\n  string command = 1;\n  string working_directory = 2;",
                      "message ShellInvocation {\n  string command = 99;\n  string cwd = 2;")]:
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace("ShellArgs ", "ShellInvocation ")
    agent.write_text(text)
    return root


def _record(root: Path) -> list[str]:
    """Server frames of a short turn, serialized with the next build's classes."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for fd in compile_protos([root / f for f in BUILTIN_FILES], [root]).file:
        pool.Add(fd)
    server = message_factory.GetMessageClass(pool.FindMessageTypeByName("agent.v1.AgentServerMessage"))
    frames = [server(interaction_update={"text_delta": {"text": "hello from the next build"}}),
              server(exec_server_message={"id": 3, "shell_args": {"command": "ls -la", "cwd": "/repo"}})]
    return [json.dumps({"hex": encode(m.SerializeToString()).hex(), "direction": "server", "transport": "run"})
            for m in frames]


def _decode(lines: list[str], *proto: str) -> list[dict[str, object]]:
    args = [sys.executable, "-m", "workbench.cli", "decode", "--batch"]
    for p in proto:
        args += ["--proto", p]
    proc = subprocess.run(args, input="\n".join(lines) + "\n", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_session_of_a_renumbered_schema_decodes_with_the_extracted_one(generators: Generators, tmp_path: Path) -> None:
    root = _next_build(tmp_path / "next")
    sources = generators.generate("v1", root, list(BUILTIN_FILES), tmp_path / "gen", "ts")
    bundle = generators.bundle("v1", sources, tmp_path / "gen", tmp_path / "app.js")[0]
    out = tmp_path / "extracted"
    proc = run_workbench("schema", "extract", str(bundle), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "message ShellInvocation {" in (out / "agent/v1/agent.proto").read_text()
    lines = _record(root)

    with_extracted = _decode(lines, str(out))
    assert [(d["kind"], d["summary"]) for d in with_extracted] == [
        ("interaction_update.text_delta", 'text "hello from the next build"'),
        ("exec_server_message.shell_args", 'exec#3 shell_args "ls -la"')]
    assert with_extracted[1]["fields"] == {"exec_server_message": {"id": 3, "shell_args": {
        "command": "ls -la", "cwd": "/repo"}}}

    with_overlay = _decode(lines)
    assert with_overlay[0]["kind"] != "interaction_update.text_delta"
    assert with_overlay[1]["fields"] != with_extracted[1]["fields"]
