"""The local executor's workspace: where file tools may look, and the environment a shell gets.

Every path a file tool touches is turned into its *real* path (``..`` collapsed, every symbolic
link followed, chains included) and refused unless that real path is the workspace folder or lies
below it. A link that points out of the workspace is therefore refused like ``../x`` or ``/etc``;
a link that stays inside works. Walks (``ls``, ``grep``, glob searches) never follow links at all,
as ripgrep does by default, so nothing is listed or searched through one.

Files are opened by their real path with ``O_NOFOLLOW`` and the opened descriptor is checked
again (on Linux through ``/proc/self/fd``, elsewhere by inode), so a link swapped in between the
check and the open is caught instead of followed.

Hard links cannot be told apart from ordinary files: one that the user placed in the workspace is
read like any file there. The shell is a different matter (see ``scrubbed_env``): no path check
confines a command, which is why the executor runs it only when explicitly allowed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

# What a shell command keeps from the client's environment: enough to find programs and behave
# normally (PATH, HOME, locale, terminal, temp dir), nothing that can carry a credential.
SHELL_ENV_KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ",
                            "TMPDIR", "TMP", "TEMP", "COLUMNS", "LINES", "NO_COLOR", "COLORTERM"})
SHELL_ENV_KEEP_PREFIXES = ("LC_",)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class OutsideWorkspace(Exception):
    """A path that leaves the workspace (``..``, an absolute path, or a symbolic link)."""


class NotRegularFile(Exception):
    """The path is a directory, a device, a FIFO, … — not something a file tool reads or writes."""


def scrubbed_env(environ: Mapping[str, str], secrets: Iterable[str] = (), cwd: str | None = None) -> dict[str, str]:
    """The environment for a local shell command: only the basics of ``SHELL_ENV_KEEP`` (plus
    ``LC_*``), and none whose value contains one of ``secrets`` (the client's bearer token).

    Everything else is dropped — ``CURSOR_*``, API keys, ``*_TOKEN``, proxy settings, cloud
    credentials — by construction rather than by a list of names to remove.
    """
    hidden = [s for s in secrets if s and len(s) >= 4]
    env = {k: v for k, v in environ.items()
           if (k in SHELL_ENV_KEEP or k.startswith(SHELL_ENV_KEEP_PREFIXES)) and not any(s in v for s in hidden)}
    env.setdefault("PATH", os.defpath)
    if cwd is not None:
        env["PWD"] = cwd
    return env


class Workspace:
    """One folder the file tools are confined to (its real path is ``root``)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(folder))
        if not self.root.is_dir():
            raise ValueError(f"workspace {str(folder)!r} is not a directory")

    def contains(self, real: str | os.PathLike[str]) -> bool:
        """Whether an already-resolved path is the workspace or below it."""
        try:
            return os.path.commonpath([str(self.root), os.fspath(real)]) == str(self.root)
        except ValueError:  # different drives, or relative vs absolute
            return False

    def _lexical(self, path: str) -> str:
        raw = path or "."
        return raw if os.path.isabs(raw) else os.path.join(self.root, raw)

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` (relative to the workspace, or absolute) if it stays inside."""
        lexical = self._lexical(path)
        real = os.path.realpath(lexical)
        if not self.contains(real):
            if self.contains(os.path.normpath(lexical)):
                raise OutsideWorkspace(f"{path!r} goes through a symbolic link that leads outside the workspace "
                                       f"{str(self.root)!r}; links out of the workspace are not followed")
            raise OutsideWorkspace(f"{path!r} is outside the workspace {str(self.root)!r}")
        return Path(real)

    def link_in_place(self, path: str) -> Path | None:
        """For a path whose last part is itself a symbolic link: the link's own location (its
        folder resolved, confined) when the link also points inside; None when it is no link."""
        lexical = self._lexical(path)
        if not os.path.islink(lexical):
            return None
        folder = os.path.realpath(os.path.dirname(lexical))
        place = Path(folder) / os.path.basename(lexical)
        if not self.contains(folder) or not self.contains(os.path.realpath(lexical)):
            raise OutsideWorkspace(f"{path!r} is a symbolic link that leads outside the workspace "
                                   f"{str(self.root)!r}")
        return place

    # opening --------------------------------------------------------------------------------

    def _check_open(self, fd: int, real: Path) -> None:
        """The descriptor really is a file inside the workspace (nothing was swapped in)."""
        proc = f"/proc/self/fd/{fd}"
        if os.path.islink(proc):
            if not self.contains(os.readlink(proc)):
                raise OutsideWorkspace(f"{str(real)!r} changed into a path outside the workspace while opening")
            return
        st, now = os.fstat(fd), os.stat(real, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            raise OutsideWorkspace(f"{str(real)!r} changed while opening")

    def read_bytes(self, real: Path, limit: int) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of a regular file inside the workspace, and its size."""
        # O_NONBLOCK: opening a FIFO someone left in the workspace must not hang the exec.
        fd = os.open(real, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
        try:
            self._check_open(fd, real)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{str(real)!r} is not a regular file")
            chunks: list[bytes] = []
            left = limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks), st.st_size
        finally:
            os.close(fd)

    def write_bytes(self, real: Path, data: bytes) -> None:
        """Create or replace a regular file inside the workspace (missing folders are made)."""
        real.parent.mkdir(parents=True, exist_ok=True)
        if not self.contains(os.path.realpath(real.parent)):
            raise OutsideWorkspace(f"{str(real.parent)!r} changed into a path outside the workspace")
        # Not O_TRUNC: the descriptor is checked first, then the file is truncated.
        fd = os.open(real, os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NONBLOCK, 0o666)
        try:
            self._check_open(fd, real)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegularFile(f"{str(real)!r} is not a regular file")
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    # walking --------------------------------------------------------------------------------

    def entries(self, folder: Path) -> list[os.DirEntry[str]]:
        """A folder's entries, sorted by name (empty when it cannot be read)."""
        try:
            with os.scandir(folder) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError:
            return []

    def walk_files(self, base: Path, skip_dirs: Iterable[str] = ()) -> list[Path]:
        """Regular files under ``base`` (or ``base`` itself), never through a symbolic link."""
        if base.is_file():
            return [base]
        skip = set(skip_dirs)
        out: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames[:] = sorted(n for n in dirnames
                                 if n not in skip and not os.path.islink(os.path.join(dirpath, n)))
            out.extend(Path(dirpath) / f for f in sorted(filenames)
                       if not os.path.islink(os.path.join(dirpath, f)))
        return out
