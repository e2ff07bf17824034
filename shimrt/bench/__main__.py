"""Run shimrt's benchmarks, each printing ratios measured side by side in one run.

python -m shimrt.bench COMMAND --help says what a command measures and takes.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Sequence

from .. import cli

#: subcommand -> its module in shimrt.bench, in the order --help lists them.
COMMANDS = {"launch": "launch", "collectives": "collectives", "gemm": "gemm", "overlap": "overlap",
            "host-cost": "host_cost", "torch": "torch_step", "plot": "plots"}


def module(command: str) -> ModuleType:
    """The module of a subcommand: its docstring, ``add_arguments`` and ``run``."""
    return importlib.import_module(f"{__package__}.{COMMANDS[command]}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shimrt.bench COMMAND [options]``; returns the exit code."""
    parser = cli.parser("python -m shimrt.bench", __doc__)
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for name in COMMANDS:
        command = module(name)
        command.add_arguments(cli.subcommand(sub, name, command.__doc__))
    return cli.main(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
