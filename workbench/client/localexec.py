"""Local execution of exec requests, confined to one workspace folder (off unless enabled).

Each handler returns the ExecClientMessage result member(s) to send: ``[(field_name, message)]``.
``shell_stream`` answers with ShellStream events and a final ``shell_result``; everything else
with one result. A refused request (a path outside the workspace, through a symbolic link or not;
a shell command while the shell is not allowed) is answered with the exec's *rejected* result and
a reason (grep, which has none, with its error), so the model re-plans and the turn goes on
(docs/protocol.md §5) rather than the exec failing.

The file tools are confined by real paths (``workbench.client.workspace``). The shell is not and
cannot be — a command can ``cat ../anything`` — so it runs only with ``allow_shell`` and then with
a scrubbed environment (no token, no ``CURSOR_*``, no credentials). It is not a sandbox.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fnmatch
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import regex
from google.protobuf import json_format
from google.protobuf.message import Message

from workbench.client._pb import pb
from workbench.client.workspace import NotRegularFile, OutsideWorkspace, Workspace, scrubbed_env

ResultParts = list[tuple[str, Message]]
# Where a streamed shell's events go while the command runs: each ShellStream event, sent at once.
Emit = Callable[[Message], Awaitable[None]]

LOCAL_KINDS = ("shell", "shell_stream", "read", "ls", "grep", "write", "delete")
SHELL_KINDS = ("shell", "shell_stream")
SHELL_DISABLED = ("the shell is disabled in this client: it runs only file tools (read, write, delete, ls, "
                  "grep) confined to the workspace unless started with --allow-shell (allow_shell=True), "
                  "because a shell command cannot be confined to the workspace")
_MAX_READ = 4 * 1024 * 1024
_MAX_GREP_FILE = 16 * 1024 * 1024
_MAX_LS_ENTRIES = 2000
_SKIP_DIRS = (".git", "__pycache__", "node_modules")
# The pattern comes from the server: one that backtracks catastrophically ("(a|aa)+$") would run for
# ages. The whole search gets this long; `regex` checks the limit while matching and, with
# concurrent=True, lets go of the GIL, so the event loop (heartbeats, other execs) keeps running.
GREP_TIME_LIMIT_S = 10.0

__all__ = ["LOCAL_KINDS", "LocalExecutor", "OutsideWorkspace", "ResultParts", "caller_result",
           "final_shell_result", "result_field"]


class ShellDisabled(Exception):
    pass


class LocalExecutor:
    """Runs file tools inside ``workspace``; the shell only when ``allow_shell`` (never confined).

    ``secrets`` are values (the client's token) that must not reach a shell's environment even
    under a name the scrubbed environment would otherwise keep.
    """

    def __init__(self, workspace: str | os.PathLike[str], shell_timeout: float = 60.0, allow_shell: bool = False,
                 secrets: tuple[str, ...] = ()) -> None:
        self.ws = Workspace(workspace)
        self.root = self.ws.root
        self.shell_timeout = shell_timeout
        self.allow_shell = allow_shell
        self._secrets = secrets
        self.grep_time_limit = GREP_TIME_LIMIT_S

    def resolve(self, path: str) -> Path:
        return self.ws.resolve(path)

    async def run(self, kind: str, args: Any, emit: Emit | None = None) -> ResultParts:
        """The result parts of one exec. With ``emit``, a ``shell_stream`` sends its start and output
        events through it while the command runs (as real clients stream them) and returns the rest."""
        if kind == "shell_stream" and emit is not None:
            return await self._shell_stream(args, emit)
        handler = getattr(self, f"_{kind}", None)
        if handler is None:
            raise NotImplementedError(f"no local handler for exec kind {kind!r}")
        parts: ResultParts = await handler(args)
        return parts

    def shell_env(self, cwd: str) -> dict[str, str]:
        return scrubbed_env(os.environ, self._secrets, cwd)

    # shell ----------------------------------------------------------------------------------

    async def _exec_shell(self, args: Any, on_output: Callable[[str, str], Awaitable[None]] | None = None
                          ) -> tuple[int, str, str, str, int]:
        if not self.allow_shell:
            raise ShellDisabled(SHELL_DISABLED)
        # Only the starting folder is checked: the command itself can go anywhere (not a sandbox).
        cwd = self.resolve(args.working_directory) if args.working_directory else self.root
        timeout = args.timeout / 1000.0 if args.timeout else self.shell_timeout
        start = time.monotonic()
        proc = await asyncio.create_subprocess_shell(
            args.command, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL, env=self.shell_env(str(cwd)),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            if on_output is None:
                out, err = await asyncio.wait_for(proc.communicate(), timeout)
            else:
                out, err = await asyncio.wait_for(_read_live(proc, on_output), timeout)
        except BaseException:  # timeout, or the server aborted the exec (task cancelled)
            # Kill the whole process group: the shell's children would keep the pipes open.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            # Drain the pipes too, so the subprocess transport closes now and not at GC time.
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.communicate())
            raise
        ms = int((time.monotonic() - start) * 1000)
        return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), str(cwd), ms

    async def _shell(self, args: Any) -> ResultParts:
        try:
            code, out, err, cwd, ms = await self._exec_shell(args)
        except (OutsideWorkspace, ShellDisabled) as exc:
            return [("shell_result", pb.ShellResult(rejected=pb.ShellRejected(
                command=args.command, working_directory=args.working_directory, reason=str(exc))))]
        except TimeoutError:
            return [("shell_result", pb.ShellResult(timeout=pb.ShellTimeout(
                command=args.command, working_directory=args.working_directory,
                timeout_ms=int(args.timeout or self.shell_timeout * 1000))))]
        except OSError as exc:
            return [("shell_result", pb.ShellResult(spawn_error=pb.ShellSpawnError(
                command=args.command, working_directory=args.working_directory, error=str(exc))))]
        fields = dict(command=args.command, working_directory=cwd, exit_code=code, stdout=out, stderr=err,
                      execution_time=ms)
        if code == 0:
            return [("shell_result", pb.ShellResult(success=pb.ShellSuccess(**fields)))]
        return [("shell_result", pb.ShellResult(failure=pb.ShellFailure(**fields)))]

    async def _shell_stream(self, args: Any, emit: Emit | None = None) -> ResultParts:
        started = False

        async def live(stream: str, text: str) -> None:
            nonlocal started
            assert emit is not None
            if not started:
                started = True
                await emit(pb.ShellStream(start=pb.ShellStreamStart()))
            event = (pb.ShellStream(stdout=pb.ShellStreamStdout(data=text)) if stream == "stdout"
                     else pb.ShellStream(stderr=pb.ShellStreamStderr(data=text)))
            await emit(event)

        try:
            code, out, err, cwd, _ = await self._exec_shell(args, live if emit is not None else None)
        except (OutsideWorkspace, ShellDisabled) as exc:
            parts: ResultParts = [("shell_stream_result", pb.ShellStream(rejected=pb.ShellRejected(
                command=args.command, working_directory=args.working_directory, reason=str(exc))))]
            return final_shell_result(args, parts)
        except TimeoutError:
            code, out, err, cwd = 124, "", "timed out", str(self.root)
        except OSError as exc:
            code, out, err, cwd = 127, "", str(exc), str(self.root)
        if emit is not None:  # start and output went out while it ran: only the exit is left
            exit_part: ResultParts = [("shell_stream_result", pb.ShellStream(exit=pb.ShellStreamExit(code=code, cwd=cwd)))]
            return exit_part if started else [("shell_stream_result", pb.ShellStream(start=pb.ShellStreamStart())),
                                              *exit_part]
        parts = [("shell_stream_result", pb.ShellStream(start=pb.ShellStreamStart()))]
        if out:
            parts.append(("shell_stream_result", pb.ShellStream(stdout=pb.ShellStreamStdout(data=out))))
        if err:
            parts.append(("shell_stream_result", pb.ShellStream(stderr=pb.ShellStreamStderr(data=err))))
        parts.append(("shell_stream_result", pb.ShellStream(exit=pb.ShellStreamExit(code=code, cwd=cwd))))
        return final_shell_result(args, parts)

    # files ----------------------------------------------------------------------------------

    async def _read(self, args: Any) -> ResultParts:
        try:
            p = self.resolve(args.path)
            if not p.exists():
                return [("read_result", pb.ReadResult(file_not_found=pb.ReadFileNotFound(path=args.path)))]
            data, size = self.ws.read_bytes(p, _MAX_READ)
        except OutsideWorkspace as exc:
            return [("read_result", pb.ReadResult(rejected=pb.ReadRejected(path=args.path, reason=str(exc))))]
        except NotRegularFile:
            return [("read_result", pb.ReadResult(invalid_file=pb.ReadInvalidFile(path=args.path,
                                                                                  reason="not a regular file")))]
        except PermissionError:
            return [("read_result", pb.ReadResult(permission_denied=pb.ReadPermissionDenied(path=args.path)))]
        except OSError as exc:
            return [("read_result", pb.ReadResult(error=pb.ReadError(path=args.path, error=str(exc))))]
        text = data.decode("utf-8", "replace")
        return [("read_result", pb.ReadResult(success=pb.ReadSuccess(
            path=args.path, content=text, total_lines=text.count("\n") + (0 if text.endswith("\n") else 1),
            file_size=size, truncated=size > len(data))))]

    async def _write(self, args: Any) -> ResultParts:
        data = bytes(args.file_bytes) if args.file_bytes else args.file_text.encode("utf-8")
        try:
            p = self.resolve(args.path)
            self.ws.write_bytes(p, data)
        except OutsideWorkspace as exc:
            return [("write_result", pb.WriteResult(rejected=pb.WriteRejected(path=args.path, reason=str(exc))))]
        except PermissionError as exc:
            return [("write_result", pb.WriteResult(permission_denied=pb.WritePermissionDenied(
                path=args.path, error=str(exc))))]
        except (OSError, NotRegularFile) as exc:
            return [("write_result", pb.WriteResult(error=pb.WriteError(path=args.path, error=str(exc))))]
        text = data.decode("utf-8", "replace")
        success = pb.WriteSuccess(path=args.path, lines_created=text.count("\n") + (1 if text and not
                                  text.endswith("\n") else 0), file_size=len(data))
        if args.return_file_content_after_write:
            success.file_content_after_write = text
        return [("write_result", pb.WriteResult(success=success))]

    async def _delete(self, args: Any) -> ResultParts:
        try:
            link = self.ws.link_in_place(args.path)
            if link is not None:  # a link that stays inside: remove the link, not what it points at
                link.unlink()
                return [("delete_result", pb.DeleteResult(success=pb.DeleteSuccess(
                    path=args.path, deleted_file=str(link))))]
            p = self.resolve(args.path)
            if not p.exists():
                return [("delete_result", pb.DeleteResult(file_not_found=pb.DeleteFileNotFound(path=args.path)))]
            if not p.is_file():
                return [("delete_result", pb.DeleteResult(not_file=pb.DeleteNotFile(
                    path=args.path, actual_type="directory" if p.is_dir() else "other")))]
            data, size = self.ws.read_bytes(p, _MAX_READ)
            p.unlink()
        except OutsideWorkspace as exc:
            return [("delete_result", pb.DeleteResult(rejected=pb.DeleteRejected(path=args.path, reason=str(exc))))]
        except PermissionError:
            return [("delete_result", pb.DeleteResult(permission_denied=pb.DeletePermissionDenied(path=args.path)))]
        except (OSError, NotRegularFile) as exc:
            return [("delete_result", pb.DeleteResult(error=pb.DeleteError(path=args.path, error=str(exc))))]
        return [("delete_result", pb.DeleteResult(success=pb.DeleteSuccess(
            path=args.path, deleted_file=str(p), file_size=size, prev_content=data.decode("utf-8", "replace"))))]

    # listing / search -----------------------------------------------------------------------

    async def _ls(self, args: Any) -> ResultParts:
        try:
            p = self.resolve(args.path)
        except OutsideWorkspace as exc:
            return [("ls_result", pb.LsResult(rejected=pb.LsRejected(path=args.path, reason=str(exc))))]
        if not p.is_dir():
            return [("ls_result", pb.LsResult(error=pb.LsError(path=args.path, error="not a directory")))]
        budget = [_MAX_LS_ENTRIES]
        return [("ls_result", pb.LsResult(success=pb.LsSuccess(
            directory_tree_root=self._tree(p, list(args.ignore), budget, depth=0))))]

    def _tree(self, d: Path, ignore: list[str], budget: list[int], depth: int) -> Any:
        node = pb.LsDirectoryTreeNode(abs_path=str(d))
        node.children_were_processed = depth < 3
        for e in self.ws.entries(d):
            if any(fnmatch.fnmatch(e.name, pat) for pat in ignore) or e.name in (".git", "__pycache__"):
                continue
            if budget[0] <= 0:
                break
            budget[0] -= 1
            # A symbolic link is listed by name only, never descended (wherever it points).
            if e.is_dir(follow_symlinks=False):
                if depth < 3:
                    node.children_dirs.append(self._tree(d / e.name, ignore, budget, depth + 1))
            else:
                node.children_files.append(pb.LsDirectoryTreeNodeFile(name=e.name))
                node.num_files += 1
        return node

    async def _grep(self, args: Any) -> ResultParts:
        # Off the event loop: walking, reading and matching a large workspace takes a while too.
        return await asyncio.to_thread(self._grep_sync, args)

    def _grep_sync(self, args: Any) -> ResultParts:
        try:
            base = self.resolve(args.path)
        except OutsideWorkspace as exc:
            return [("grep_result", pb.GrepResult(error=pb.GrepError(error=str(exc))))]
        files = self.ws.walk_files(base, _SKIP_DIRS)
        if args.glob:
            files = [f for f in files if fnmatch.fnmatch(f.name, args.glob)
                     or fnmatch.fnmatch(str(f.relative_to(self.root)), args.glob)]
        mode = args.output_mode or "files_with_matches"
        union = pb.GrepUnionResult()
        if not args.pattern:  # glob-only search: just the file list
            names = [str(f.relative_to(self.root)) for f in files]
            union.files.CopyFrom(pb.GrepFilesResult(files=names, total_files=len(names)))
            mode = "files_with_matches"
        else:
            try:
                # VERSION0: the syntax and behaviour of Python's re, which this tool used before
                rx = regex.compile(args.pattern, regex.VERSION0 | (regex.IGNORECASE if args.case_insensitive else 0))
            except (regex.error, OverflowError, RecursionError) as exc:
                return [("grep_result", pb.GrepResult(error=pb.GrepError(error=f"bad pattern: {exc}")))]
            deadline = time.monotonic() + self.grep_time_limit
            matches: list[tuple[str, list[tuple[int, str]]]] = []
            try:
                for f in files:
                    try:
                        data, _ = self.ws.read_bytes(f, _MAX_GREP_FILE)
                    except (OSError, OutsideWorkspace, NotRegularFile):
                        continue
                    lines = data.decode("utf-8", "replace").splitlines()
                    hits = []
                    for i, line in enumerate(lines):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise TimeoutError
                        if rx.search(line, timeout=left, concurrent=True):
                            hits.append((i + 1, line))
                    if hits:
                        matches.append((str(f.relative_to(self.root)), hits))
            except TimeoutError:
                return [("grep_result", pb.GrepResult(error=pb.GrepError(
                    error=f"pattern {args.pattern!r}: the search took longer than {self.grep_time_limit:g} s and "
                          f"was stopped (a pattern that backtracks heavily, or too much to search)")))]
            if mode == "content":
                content = pb.GrepContentResult(
                    total_matched_lines=sum(len(h) for _, h in matches))
                for name, hits in matches:
                    content.matches.append(pb.GrepFileMatch(file=name, matches=[
                        pb.GrepContentMatch(line_number=n, content=line) for n, line in hits]))
                union.content.CopyFrom(content)
            elif mode == "count":
                union.count.CopyFrom(pb.GrepCountResult(
                    counts=[pb.GrepFileCount(file=n, count=len(h)) for n, h in matches],
                    total_files=len(matches), total_matches=sum(len(h) for _, h in matches)))
            else:
                union.files.CopyFrom(pb.GrepFilesResult(files=[n for n, _ in matches], total_files=len(matches)))
        success = pb.GrepSuccess(pattern=args.pattern, path=args.path, output_mode=mode)
        success.workspace_results[str(self.root)].CopyFrom(union)
        return [("grep_result", pb.GrepResult(success=success))]


async def _read_live(proc: asyncio.subprocess.Process, on_output: Callable[[str, str], Awaitable[None]]
                     ) -> tuple[bytes, bytes]:
    """A process's stdout and stderr read as they come (each piece handed to ``on_output``), then
    its exit awaited; the whole of both, as ``communicate`` returns them."""
    got: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    async def pump(name: str, pipe: asyncio.StreamReader | None) -> None:
        if pipe is None:
            return
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while chunk := await pipe.read(65536):
            got[name] += chunk
            text = decoder.decode(chunk)
            if text:
                await on_output(name, text)
        tail = decoder.decode(b"", final=True)
        if tail:
            await on_output(name, tail)

    await asyncio.gather(pump("stdout", proc.stdout), pump("stderr", proc.stderr))
    await proc.wait()
    return bytes(got["stdout"]), bytes(got["stderr"])


def final_shell_result(args: Any, parts: ResultParts) -> ResultParts:
    """A streamed shell's answer as current real clients send it: the ShellStream events, then one
    final ``shell_result`` summing them up (output, exit code; or the refusal). Unchanged when the
    parts already end with a ``shell_result`` or hold no exit/refusal to sum up."""
    if any(name == "shell_result" for name, _ in parts):
        return parts
    out, err = [], []
    command = getattr(args, "command", "")
    wd = getattr(args, "working_directory", "")
    final: Any = None
    for name, ev in parts:
        if name != "shell_stream_result":
            continue
        which = ev.WhichOneof("event")  # type: ignore[attr-defined]
        if which == "stdout":
            out.append(ev.stdout.data)  # type: ignore[attr-defined]
        elif which == "stderr":
            err.append(ev.stderr.data)  # type: ignore[attr-defined]
        elif which == "exit":
            code = ev.exit.code  # type: ignore[attr-defined]
            fields = dict(command=command, working_directory=ev.exit.cwd or wd,  # type: ignore[attr-defined]
                          exit_code=code, stdout="".join(out), stderr="".join(err))
            final = (pb.ShellResult(success=pb.ShellSuccess(**fields)) if code == 0
                     else pb.ShellResult(failure=pb.ShellFailure(**fields)))
        elif which == "rejected":
            final = pb.ShellResult(rejected=ev.rejected)  # type: ignore[attr-defined]
        elif which == "permission_denied":
            final = pb.ShellResult(permission_denied=ev.permission_denied)  # type: ignore[attr-defined]
    return parts if final is None else [*parts, ("shell_result", final)]


# Caller answers ------------------------------------------------------------------------------

_TEXT_RESULT_FIELD = {
    "shell": "shell_result", "shell_stream": "shell_stream_result", "read": "read_result",
    "write": "write_result", "delete": "delete_result", "ls": "ls_result", "grep": "grep_result",
    "mcp": "mcp_result", "fetch": "fetch_result",
}


# Exec kinds handed to the caller as ``ExecRequest``. The overlay types every exec member, but the
# newer ones (computer use, subagents, hooks, the pi_* tools, allowlist prechecks, …) are features
# this client does not have: like a real client without them, it throws UNIMPLEMENTED.
CALLER_KINDS = frozenset({"shell", "shell_stream", "read", "write", "delete", "grep", "ls", "mcp", "fetch",
                          "background_shell_spawn", "write_shell_stdin"})


def result_field(kind: str) -> str | None:
    """ExecClientMessage member answering ``<kind>_args``; None for kinds the client does not answer."""
    if kind not in CALLER_KINDS:
        return None
    name = f"{kind}_result"
    desc = pb.ExecClientMessage.DESCRIPTOR.fields_by_name.get(name)
    if desc is None or desc.message_type is None:
        return None
    return name


def caller_result(kind: str, args: Any, value: Any) -> ResultParts:
    """Turn what a caller answered (message, dict, list of parts, or text) into result parts."""
    field_name = result_field(kind)
    if field_name is None:
        raise ValueError(f"exec kind {kind!r} has no result message the client can build")
    cls = type(getattr(pb.ExecClientMessage(), field_name))
    if isinstance(value, Message):
        return [(field_name, value)]
    if isinstance(value, list):
        return [(field_name, v if isinstance(v, Message) else json_format.ParseDict(v, cls())) for v in value]
    if isinstance(value, dict):
        return [(field_name, json_format.ParseDict(value, cls()))]
    text = value if isinstance(value, str) else str(value)
    path = getattr(args, "path", "")
    if kind == "shell":
        return [(field_name, pb.ShellResult(success=pb.ShellSuccess(command=args.command, stdout=text)))]
    if kind == "shell_stream":
        return [(field_name, pb.ShellStream(stdout=pb.ShellStreamStdout(data=text))),
                (field_name, pb.ShellStream(exit=pb.ShellStreamExit(code=0)))]
    if kind == "read":
        return [(field_name, pb.ReadResult(success=pb.ReadSuccess(
            path=path, content=text, total_lines=len(text.splitlines()), file_size=len(text.encode()))))]
    if kind == "write":
        return [(field_name, pb.WriteResult(success=pb.WriteSuccess(path=path, file_size=len(args.file_text))))]
    if kind == "delete":
        return [(field_name, pb.DeleteResult(success=pb.DeleteSuccess(path=path, deleted_file=path)))]
    if kind == "ls":
        node = pb.LsDirectoryTreeNode(abs_path=path, children_were_processed=True)
        for line in text.splitlines():
            if line.strip():
                node.children_files.append(pb.LsDirectoryTreeNodeFile(name=line.strip()))
        return [(field_name, pb.LsResult(success=pb.LsSuccess(directory_tree_root=node)))]
    if kind == "grep":
        files = [ln.strip() for ln in text.splitlines() if ln.strip()]
        success = pb.GrepSuccess(pattern=args.pattern, path=path, output_mode="files_with_matches")
        success.workspace_results[path or "."].files.CopyFrom(pb.GrepFilesResult(files=files, total_files=len(files)))
        return [(field_name, pb.GrepResult(success=success))]
    if kind == "mcp":
        return [(field_name, pb.McpResult(success=pb.McpSuccess(content=[
            pb.McpToolResultContentItem(text=pb.McpTextContent(text=text))])))]
    if kind == "fetch":
        return [(field_name, pb.FetchResult(success=pb.FetchSuccess(url=args.url, content=text, status_code=200)))]
    raise ValueError(f"cannot build a {field_name} from text; pass a message or dict")
