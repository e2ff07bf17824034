"""List shimrt's commands, each with what it does.

Run one with python -m <command> (python -m <command> --help for its options).
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import textwrap
from typing import Sequence

from . import cli


def commands() -> list[tuple[str, str]]:
    """(command, one-line summary from its docstring) for every command of shimrt."""
    from .bench import __main__ as bench

    def of(name: str) -> tuple[str, str]:
        return name, cli.summary(importlib.import_module(name).__doc__)
    return [of("shimrt.selftest"), of("shimrt.launch"), ("shimrt.bench", cli.summary(bench.__doc__)),
            *[(f"shimrt.bench {name}", cli.summary(bench.module(name).__doc__)) for name in bench.COMMANDS],
            of("shimrt.overlap.footprint")]


def listing(width: int | None = None) -> str:
    """The commands as a two-column list, summaries wrapped to ``width`` (default: the terminal's)."""
    width = width or shutil.get_terminal_size().columns
    rows = commands()
    left = max(len(name) for name, _ in rows) + 4
    lines = ["commands:"]
    for name, text in rows:
        lines.append(textwrap.fill(text, width=max(width, left + 30), initial_indent=f"  {name}".ljust(left),
                                   subsequent_indent=" " * left))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shimrt``: print the commands and exit 0 (``--version``: the version)."""
    parser = cli.parser("python -m shimrt", f"{cli.summary(sys.modules['shimrt'].__doc__)}\n\n{__doc__}",
                        epilog=listing())

    def show(_: argparse.Namespace) -> int:
        print(parser.epilog)
        return 0
    return cli.main(parser, argv, show)


if __name__ == "__main__":
    sys.exit(main())
