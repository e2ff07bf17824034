"""python -m shimrt.bench SUBCOMMAND [options]"""

from __future__ import annotations

import argparse
import sys

from ..errors import ShimrtError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shimrt.bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from . import collectives, gemm, launch, overlap, plots
    launch.add_arguments(sub.add_parser("launch", help=launch.__doc__.splitlines()[0]))
    collectives.add_arguments(sub.add_parser("collectives", help=collectives.__doc__.splitlines()[0]))
    gemm.add_arguments(sub.add_parser("gemm", help=gemm.__doc__.splitlines()[0]))
    overlap.add_arguments(sub.add_parser("overlap", help=overlap.__doc__.splitlines()[0]))
    plots.add_arguments(sub.add_parser("plot", help=plots.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ShimrtError as exc:
        print(f"shimrt.bench {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
