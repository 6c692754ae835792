"""Local tools stay inside their workspace (issue 12, probe 5).

Escapes tried for every file tool (read, write, delete, ls, grep, glob search): a symbolic link to a
file outside, a link to a folder outside, a chain of links, an absolute path, ``..``, and a link
deeper in the tree. Each is refused with the exec's own refusal (rejected, or grep's error) and a
reason, the outside file's content never goes upstream, and the turn goes on. The shell is refused
unless allowed, and when allowed it runs without the token or credential variables.

Two levels: the executor directly, and the real client (``workbench client`` and the library)
against a real ``workbench sim`` subprocess whose scenarios ask for exactly these paths.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import WORKBENCH, start_sim
from support import SimProcess as Sim

from workbench.client.agent import AgentClient
from workbench.client.events import ExecHandled
from workbench.client.localexec import LocalExecutor
from workbench.client.workspace import scrubbed_env
from workbench.schema import pb
from workbench.store.reader import open_reader

SECRET = "TOP-SECRET-OUTSIDE-42"
TOKEN = "sk-local-tools-token-5f3a9c"


@dataclass
class Layout:
    root: Path
    ws: Path
    outside: Path

    @property
    def secret_file(self) -> Path:
        return self.outside / "secret.txt"


def make_layout(root: Path) -> Layout:
    """ws/ with links out of it (file, folder, chain, deeper, dangling) and one that stays inside."""
    outside, ws = root / "outside", root / "ws"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    (outside / "dir" / "inner.txt").write_text(f"{SECRET} inner\n")
    (ws / "sub").mkdir(parents=True)
    (ws / "README.md").write_text("# demo\nhello world\n")
    (ws / "link_file").symlink_to(outside / "secret.txt")
    (ws / "link_dir").symlink_to(outside)
    (ws / "chain2").symlink_to(Path("..") / "outside" / "secret.txt")
    (ws / "chain1").symlink_to("chain2")
    (ws / "sub" / "deep_link").symlink_to(Path("..") / ".." / "outside")
    (ws / "dangling_out").symlink_to(outside / "created-through-link.txt")
    (ws / "inner_link").symlink_to("README.md")
    return Layout(root, ws, outside)


def escapes(lay: Layout) -> list[str]:
    """Paths naming something outside the workspace, one per way out."""
    return ["link_file", "link_dir/secret.txt", "chain1", str(lay.secret_file), "../outside/secret.txt",
            "sub/../../outside/secret.txt", "sub/deep_link/secret.txt"]


FOLDER_ESCAPES = ["link_dir", "sub/deep_link", "..", "../outside"]


@pytest.fixture
def lay(tmp_path: Path) -> Layout:
    return make_layout(tmp_path)


def one(parts: list[tuple[str, Any]]) -> Any:
    [(_, message)] = parts
    return message


def outcome(message: Any) -> str:
    return str(message.WhichOneof("event" if "event" in message.DESCRIPTOR.oneofs_by_name else "result"))


def untouched(lay: Layout) -> None:
    assert lay.secret_file.read_text() == f"{SECRET}\n"
    assert sorted(p.name for p in lay.outside.iterdir()) == ["dir", "secret.txt"]


# the executor, directly ---------------------------------------------------------------------------

async def test_read_refuses_every_way_out(lay: Layout) -> None:
    ex = LocalExecutor(lay.ws)
    for path in escapes(lay):
        res = one(await ex.run("read", pb.ReadArgs(path=path)))
        assert outcome(res) == "rejected", path
        assert "outside the workspace" in res.rejected.reason, path
        assert SECRET not in str(res), path
    link = one(await ex.run("read", pb.ReadArgs(path="link_file"))).rejected.reason
    assert "symbolic link" in link


async def test_write_refuses_every_way_out(lay: Layout) -> None:
    ex = LocalExecutor(lay.ws)
    for path in [*escapes(lay), "dangling_out", "link_dir/new.txt", "sub/deep_link/dir/new.txt"]:
        res = one(await ex.run("write", pb.WriteArgs(path=path, file_text="overwritten")))
        assert outcome(res) == "rejected", path
        assert res.rejected.reason, path
    untouched(lay)


async def test_delete_refuses_every_way_out(lay: Layout) -> None:
    ex = LocalExecutor(lay.ws)
    for path in escapes(lay):
        res = one(await ex.run("delete", pb.DeleteArgs(path=path)))
        assert outcome(res) == "rejected", path
        assert res.rejected.reason, path
        assert SECRET not in str(res)
    untouched(lay)
    assert (lay.ws / "link_file").is_symlink()  # not even the link was removed


async def test_ls_neither_lists_through_links_nor_leaves(lay: Layout) -> None:
    ex = LocalExecutor(lay.ws)
    for path in [*FOLDER_ESCAPES, str(lay.outside)]:
        res = one(await ex.run("ls", pb.LsArgs(path=path)))
        assert outcome(res) == "rejected", path
        assert res.rejected.reason, path
    tree = one(await ex.run("ls", pb.LsArgs(path="."))).success.directory_tree_root

    def names(node: Any) -> list[str]:
        out = [f.name for f in node.children_files] + [node.abs_path]
        for d in node.children_dirs:
            out += names(d)
        return out

    listed = names(tree)
    assert "secret.txt" not in listed
    assert "inner.txt" not in listed
    assert not any(str(lay.outside) in n for n in listed)
    assert {"link_dir", "link_file", "README.md"} <= set(listed)  # links are listed by name, not entered
    sub = next(d for d in tree.children_dirs if d.abs_path.endswith("/sub"))
    assert [f.name for f in sub.children_files] == ["deep_link"]
    assert not sub.children_dirs


async def test_grep_and_glob_never_read_or_list_outside_files(lay: Layout) -> None:
    ex = LocalExecutor(lay.ws)
    for mode in ("content", "files_with_matches", "count"):
        res = one(await ex.run("grep", pb.GrepArgs(pattern="SECRET|hello", path=".", output_mode=mode)))
        assert outcome(res) == "success"
        assert SECRET not in str(res), mode
        assert "link_file" not in str(res), mode
        assert "chain1" not in str(res), mode
    hits = one(await ex.run("grep", pb.GrepArgs(pattern="hello", path=".", output_mode="content")))
    [union] = hits.success.workspace_results.values()
    assert [m.file for m in union.content.matches] == ["README.md"]
    for path in [*escapes(lay), *FOLDER_ESCAPES]:
        res = one(await ex.run("grep", pb.GrepArgs(pattern="SECRET", path=path)))
        assert outcome(res) == "error", path
        assert "outside the workspace" in res.error.error, path
    for pattern in ("*", "*.txt", "**/*", "../outside/*", "link_dir/*"):
        res = one(await ex.run("grep", pb.GrepArgs(glob=pattern, path=".")))
        [union] = res.success.workspace_results.values()
        assert not any("secret" in f or "inner" in f or "link" in f for f in union.files.files), pattern


async def test_links_that_stay_inside_still_work(lay: Layout) -> None:
    ex = LocalExecutor(lay.ws)
    res = one(await ex.run("read", pb.ReadArgs(path="inner_link")))
    assert res.success.content.startswith("# demo")
    res = one(await ex.run("read", pb.ReadArgs(path=str(lay.ws / "README.md"))))  # absolute, inside
    assert outcome(res) == "success"
    res = one(await ex.run("delete", pb.DeleteArgs(path="inner_link")))
    assert outcome(res) == "success"
    assert not (lay.ws / "inner_link").exists()
    assert (lay.ws / "README.md").exists()  # the link, not its target


async def test_shell_is_refused_without_allow_shell(lay: Layout) -> None:
    ex = LocalExecutor(lay.ws)
    res = one(await ex.run("shell", pb.ShellArgs(command="touch ran-anyway")))
    assert outcome(res) == "rejected"
    assert "--allow-shell" in res.rejected.reason
    parts = await ex.run("shell_stream", pb.ShellArgs(command="touch ran-anyway"))
    assert [name for name, _ in parts] == ["shell_stream_result", "shell_result"]
    assert outcome(parts[0][1]) == "rejected"
    assert outcome(parts[1][1]) == "rejected"
    assert not (lay.ws / "ran-anyway").exists()


@pytest.mark.slow
async def test_allowed_shell_gets_a_scrubbed_environment(lay: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"CURSOR_ACCESS_TOKEN": TOKEN, "CURSOR_API_KEY": "cursor-api-key-value",
                        "OPENAI_API_KEY": "sk-openai-value", "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
                        "GITHUB_TOKEN": "ghp-value", "HTTPS_PROXY": "http://proxy.invalid:1",
                        "LC_TOKEN_LEAK": f"x{TOKEN}x"}.items():
        monkeypatch.setenv(name, value)
    ex = LocalExecutor(lay.ws, allow_shell=True, secrets=(TOKEN,))
    res = one(await ex.run("shell", pb.ShellArgs(command="env")))
    out = res.success.stdout
    for leaked in (TOKEN, "cursor-api-key-value", "sk-openai-value", "aws-secret-value", "ghp-value", "CURSOR_",
                   "proxy.invalid"):
        assert leaked not in out, leaked
    assert "PATH=" in out
    assert "HOME=" in out
    assert f"PWD={lay.ws}" in out
    # still no sandbox: the working folder is checked, the command is not
    res = one(await ex.run("shell", pb.ShellArgs(command="pwd", working_directory="link_dir")))
    assert outcome(res) == "rejected"


def test_scrubbed_env_keeps_the_basics_only() -> None:
    env = scrubbed_env({"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm",
                        "CURSOR_X": "1", "API_TOKEN": "t", "SSL_CERT_FILE": "/c"}, secrets=("never-there",))
    assert env == {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm"}


# through the real client and the real sim ----------------------------------------------------------

def tool(kind: str, **args: Any) -> dict[str, Any]:
    return {"tool": {"exec": kind, "args": args, "client_tools": "never"}}


def scenarios(lay: Layout) -> dict[str, Any]:
    tail = [{"text": "Carried on after: {tool_result}", "chunks": 1}, {"checkpoint": True},
            {"step_completed": True}, {"turn_ended": True}, {"end": "ok"}]
    files = [tool(k, path=p) for p in escapes(lay) for k in ("read", "delete")]
    files += [tool("write", path=p, contents="overwritten") for p in [*escapes(lay), "dangling_out"]]
    files += [tool("ls", path=p) for p in [*FOLDER_ESCAPES, "."]]
    files += [tool("grep", pattern="SECRET|hello", path=p) for p in [".", "link_file", "link_dir"]]
    shell = [tool("shell", command="touch ran-anyway; cat ../outside/secret.txt"),
             tool("shell_stream", command="touch ran-anyway")]
    env = [tool("shell", command="env")]
    head = [{"kv_set": "system"}, {"kv_set": "user"}]
    return {"escapes": {"steps": [*head, *files, *tail]}, "shell_escape": {"steps": [*head, *shell, *tail]},
            "shell_env": {"steps": [*head, *env, *tail]}}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Layout, Sim]]:
    root = tmp_path_factory.mktemp("local-tools")
    lay = make_layout(root)
    sim = start_sim(root, scenarios=scenarios(lay))
    yield lay, sim
    sim.stop(timeout=30)


def client_payloads(db: Path) -> list[tuple[str, bytes]]:
    reader = open_reader(db)
    try:
        rows = reader.query("SELECT kind, payload FROM frames WHERE direction = 'client' ORDER BY seq").to_pylist()
    finally:
        reader.close()
    return [(r["kind"], bytes(r["payload"] or b"")) for r in rows]


def exec_outcomes(db: Path) -> list[tuple[str, str]]:
    """(result member, its oneof case) of every exec result the client sent."""
    out = []
    for kind, payload in client_payloads(db):
        if kind.startswith("exec_client_message."):
            ecm = pb.AgentClientMessage.FromString(payload).exec_client_message
            member = str(ecm.WhichOneof("result"))
            out.append((member, outcome(getattr(ecm, member))))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_escapes_through_the_client_are_refused_and_the_turn_goes_on(
        world: tuple[Layout, Sim], tmp_path: Path, transport: str) -> None:
    lay, sim = world
    db = tmp_path / "rec.duckdb"
    async with AgentClient(sim.url, TOKEN, transport=transport, verify=sim.cert, workspace=lay.ws,
                           execute_locally=True, record_to=db, heartbeat_budget=400) as c:
        res = await c.run_turn("[scenario:escapes] look around")
    summary = await asyncio.to_thread(sim.next_run)
    assert res.ended
    assert res.error is None
    assert "-> turn_ended" in summary  # the model re-planned
    outcomes = exec_outcomes(db)
    n = len(escapes(lay))
    assert outcomes[:2 * n] == [("read_result", "rejected"), ("delete_result", "rejected")] * n
    assert outcomes[2 * n:3 * n + 1] == [("write_result", "rejected")] * (n + 1)
    assert outcomes[3 * n + 1:] == [("ls_result", "rejected")] * len(FOLDER_ESCAPES) + [
        ("ls_result", "success"), ("grep_result", "success"), ("grep_result", "error"), ("grep_result", "error")]
    # nothing from outside went upstream, whatever the frame
    assert not any(SECRET.encode() in payload for _, payload in client_payloads(db))
    refused = [e for e in res.events if isinstance(e, ExecHandled) and not e.ok]
    assert len(refused) == 3 * n + 1 + len(FOLDER_ESCAPES)
    untouched(lay)


def run_cli(world: tuple[Layout, Sim], db: Path, prompt: str, *extra: str) -> subprocess.CompletedProcess[str]:
    lay, sim = world
    env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()}, "CURSOR_ACCESS_TOKEN": TOKEN,
           "CURSOR_API_KEY": "cursor-api-key-value", "AWS_SECRET_ACCESS_KEY": "aws-secret-value"}
    return subprocess.run([*WORKBENCH, "client", "--upstream", sim.url, "--ca-file", sim.cert, "--execute-locally",
                           "--workspace", str(lay.ws), "--record", str(db), "--heartbeat-budget", "400", *extra,
                           prompt], capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.slow
def test_shell_is_refused_without_allow_shell_through_the_cli(world: tuple[Layout, Sim], tmp_path: Path) -> None:
    lay, sim = world
    db = tmp_path / "cli.duckdb"
    proc = run_cli(world, db, "[scenario:shell_escape] try the shell")
    summary = sim.next_run()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Carried on after")
    assert "-> turn_ended" in summary
    assert [o for o in exec_outcomes(db) if o[0] == "shell_result"] == [("shell_result", "rejected")] * 2
    assert ("shell_stream_result", "rejected") in exec_outcomes(db)
    assert not (lay.ws / "ran-anyway").exists()
    assert not any(SECRET.encode() in payload for _, payload in client_payloads(db))


@pytest.mark.slow
def test_allowed_shell_runs_without_the_token(world: tuple[Layout, Sim], tmp_path: Path) -> None:
    _, sim = world
    db = tmp_path / "env.duckdb"
    proc = run_cli(world, db, "[scenario:shell_env] show the environment", "--allow-shell")
    summary = sim.next_run()
    assert proc.returncode == 0, proc.stderr
    assert "-> turn_ended" in summary
    [env_out] = [pb.AgentClientMessage.FromString(p).exec_client_message.shell_result.success.stdout
                 for k, p in client_payloads(db) if k == "exec_client_message.shell_result"]
    assert "PATH=" in env_out  # the command ran and printed its environment
    for leaked in (TOKEN, "CURSOR_", "cursor-api-key-value", "aws-secret-value"):
        assert leaked not in env_out, leaked
    assert TOKEN not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_allow_shell_needs_execute_locally(tmp_path: Path) -> None:
    proc = subprocess.run([*WORKBENCH, "client", "--upstream", "https://127.0.0.1:9", "--allow-shell", "hi"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "CURSOR_ACCESS_TOKEN": "t"})
    assert proc.returncode == 2
    assert "--allow-shell needs --execute-locally" in proc.stderr
    assert "Traceback" not in proc.stderr
