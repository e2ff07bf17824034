"""Measure what the loaded NCCL's kernels need per SM, from CUPTI's launch records.

``python -m shimrt.overlap.footprint`` runs a few collectives on a single-rank communicator
(one GPU) and prints, for every kernel NCCL launched, its grid, block, registers per thread and
static and dynamic shared memory, as a table and as JSON. With one rank NCCL may do some
operations with copies and no kernel at all; what it printed is what it launched.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from .. import cli, validate
from ..device import Device
from ..errors import UsageError
from ..nccl import CommOptions, Communicator, unique_id

__all__ = ["main"]


def _operations(comm: Communicator, send, recv) -> dict:
    """name -> function enqueueing one operation on the communicator's stream."""

    def all_reduce(op):
        return lambda: comm.all_reduce(send, recv, op=op)

    def send_recv_self():
        with comm.group():
            comm.send(send, comm.rank)
            comm.recv(recv, comm.rank)

    return {"all_reduce sum": all_reduce("sum"), "all_reduce avg": all_reduce("avg"),
            "all_reduce max": all_reduce("max"), "send/recv to self (grouped)": send_recv_self}


def measure(device: Device | None = None, nbytes: int = 64 << 20, *, timeout: float = 120.0) -> dict:
    """Launch records of NCCL's kernels for each operation on a single-rank communicator.

    Every wait is bounded by ``timeout`` seconds; a failure aborts the communicator."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 4:
        raise UsageError(f"nbytes must be an int of at least 4 (one float32), not {nbytes!r}")
    dev = device or Device()
    dev.record_kernels()  # the backend says here, before any NCCL work, if it cannot record kernels (HIP: roctracer)
    count = nbytes // 4
    with Communicator(dev, unique_id(backend=dev.backend), 0, 1, options=CommOptions(timeout=timeout)) as comm:
        result = {"nccl": comm.lib.version_text, "nccl_path": comm.lib.path, "device": dev.name,
                  "operations": {}}
        send, recv = dev.to_device(np.ones(count, np.float32)), dev.empty(count, np.float32)
        for name, run in _operations(comm, send, recv).items():
            run()  # warm up outside the recording: first-use setup launches kernels of its own
            comm.wait()
            with dev.record_kernels() as rec:
                run()
                comm.wait()
            result["operations"][name] = rec.kernels
        result["cupti_path"] = rec.path
    return result


def report(result: dict) -> str:
    lines = [f"NCCL {result['nccl']} on {result['device']} ({result['nccl_path']})",
             f"{'operation':30s} {'kernel':58s} {'grid':>12s} {'block':>10s} {'regs':>5s} {'static':>7s} "
             f"{'dynamic':>8s}"]
    for op, kernels in result["operations"].items():
        if not kernels:
            lines.append(f"{op:30s} (no kernel: NCCL did this without launching one)")
        for k in kernels:
            lines.append(f"{op:30s} {k['name'][:58]:58s} {str((k['grid_x'], k['grid_y'], k['grid_z'])):>12s} "
                         f"{str((k['block_x'], k['block_y'], k['block_z'])):>10s} {k['registers']:5d} "
                         f"{k['static_smem']:7d} {k['dynamic_smem']:8d}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shimrt.overlap.footprint [--bytes SIZE] [--json PATH]``; returns the exit code."""
    parser = cli.parser("python -m shimrt.overlap.footprint", __doc__)
    # At most 4G: the message is staged through host memory, filled with ones.
    parser.add_argument("--bytes", metavar="SIZE", default="64M",
                        type=validate.argument(cli.nbytes, "--bytes", least=4, most=1 << 32),
                        help="message size from 4 (one float32) to 4G, e.g. 4096, 64K, 64M (default 64M)")
    cli.add_json(parser, "also write the records as JSON")
    return cli.main(parser, argv, run)


def run(args: argparse.Namespace) -> int:
    """The command: measure, then print the report (or --json)."""
    result = measure(nbytes=args.bytes)
    return cli.finish(report(result), result, args.json)


if __name__ == "__main__":
    sys.exit(main())
