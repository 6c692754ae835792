"""One browser session of ``workbench web``: the TUI, drawn by Textual's web driver.

textual-serve starts this once per open page, with ``TEXTUAL_DRIVER`` pointing at the web driver
and the page's terminal size in the environment; stdin/stdout are the server's pipes, not a TTY,
which is why this is not ``workbench tui`` (that refuses to run without a terminal).

    python -m workbench.web.child --db PATH [--follow] [--poll S] [--proto PATH]...
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.web.child")
    p.add_argument("--db", required=True)
    p.add_argument("--follow", action="store_true")
    p.add_argument("--poll", type=float, default=0.5)
    p.add_argument("--proto", action="append", default=[])
    args = p.parse_args(argv)

    # the TUI (Textual) loads only after the arguments are parsed
    from workbench.commands.common import decoder_from
    from workbench.tui.app import WorkbenchApp
    from workbench.tui.data import TuiData

    # the decoder every decoding command uses (the active schema, or --proto)
    data = TuiData(args.db, decoder_from(args), transient=args.follow)
    WorkbenchApp(args.db, follow=args.follow, poll_interval=args.poll, data=data).run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
