"""What the selftest checks of MPS: whether it is available here (:func:`status`), and a
collective across rank processes that share a GPU under it (:func:`selftest`): ``python -m
shimrt.launch --nproc 2 --devices 0,0 --mps -m shimrt.launch.mpscheck`` makes each rank all-reduce
inputs of its own and compare every element of the sum with numpy's (:func:`main`, the rank
side), and the launcher starts and stops the MPS daemon around them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .. import validate
from ..config import launch_env
from ..errors import CollectiveError, ShimrtError
from . import mps

__all__ = ["Unavailable", "status", "selftest", "main"]

if TYPE_CHECKING:
    from ..device import Device
    from ..nccl.library import Library

#: float32 elements each rank all-reduces.
COUNT = 1 << 18
#: Seconds the launcher gives its ranks (--timeout); the whole launch gets 30 more.
TIMEOUT_S = 60.0
_SHARE_FIX = ("run on a machine with several GPUs, or with NCCL 2.30+ (SHIMRT_NCCL_LIBRARY) and "
              "NCCL_MULTI_RANK_GPU_ENABLE=1")


class Unavailable(ShimrtError):
    """The check cannot run here: the reason, and ``fix``, what would let it."""

    def __init__(self, reason: str, fix: str = ""):
        super().__init__(reason)
        self.fix = fix


def status() -> str:
    """Where MPS's control program is and which daemons run; Unavailable when it is missing."""
    try:
        control = mps.find_control()
    except mps.MpsError as exc:
        raise Unavailable(str(exc)) from None  # it says what to install
    daemons = mps.running(control)
    if daemons:
        return (f"{control}; a daemon already runs: {'; '.join(map(str, daemons))} (python -m shimrt.launch "
                "--mps refuses while it runs)")
    return f"{control}; no daemon runs (python -m shimrt.launch --mps starts its own)"


def inputs(rank: int, count: int = COUNT) -> np.ndarray:
    """Rank ``rank``'s input: small integers, so that every sum is exact in float32 whatever
    order NCCL adds in, and every element can be compared exactly."""
    return np.random.default_rng(2000 + rank).integers(-8, 9, count).astype(np.float32)


def main() -> int:
    """The rank side, under the launcher: all_reduce this rank's inputs, compare the sum with
    numpy's, print ``MPSCHECK <rank> <size> OK`` (or ``WRONG <count>``); 1 when it is wrong."""
    from ..nccl import CommOptions
    from . import init
    comm = init(options=CommOptions(timeout=TIMEOUT_S))
    try:
        buf = comm.device.to_device(inputs(comm.rank))
        comm.all_reduce(buf)
        comm.wait(timeout=TIMEOUT_S)
        want = np.sum([inputs(r) for r in range(comm.size)], axis=0, dtype=np.float32)
        wrong = int(np.count_nonzero(buf.numpy() != want))
    finally:
        comm.close()
    print(f"MPSCHECK {comm.rank} {comm.size} {f'WRONG {wrong}' if wrong else 'OK'}", flush=True)
    return 1 if wrong else 0


def run(devices: Sequence[int], *, use_mps: bool = True, timeout: float = TIMEOUT_S) -> str:
    """:func:`main` in one process per entry of ``devices`` (GPU indices, repeats sharing a GPU)
    through python -m shimrt.launch, with --mps where ``use_mps``, bounded by ``timeout``
    seconds (plus 30 for the launch). ShimrtError, with the launcher's and the ranks' last
    words, unless every rank's sum equals numpy's."""
    devices = [validate.integer(d, "every item of devices", least=0) for d in devices]
    timeout = validate.number(timeout, "timeout", positive=True)
    where = f"{len(devices)} processes on GPUs {devices}" + (" under MPS" if use_mps else "")
    argv = [sys.executable, "-m", "shimrt.launch", "--nproc", str(len(devices)), "--devices",
            ",".join(map(str, devices)), "--timeout", f"{timeout:g}", *(["--mps"] if use_mps else []),
            "-m", "shimrt.launch.mpscheck"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        raise ShimrtError(f"{where}: the launch did not end within {timeout + 30:g} s") from None
    right = re.findall(rf"^\[rank (\d+)\] MPSCHECK \1 {len(devices)} OK$", done.stdout, re.M)
    if done.returncode != 0 or len(right) != len(devices):
        last = [(text.strip().splitlines() or ["(nothing)"])[-1] for text in (done.stdout, done.stderr)]
        raise ShimrtError(f"{where}: the launcher exited with {done.returncode} and {len(right)} of "
                          f"{len(devices)} ranks' sums equal numpy's; last rank line: {last[0]}; launcher: {last[1]}")
    return f"all_reduce of {where} equals numpy (python -m shimrt.launch{' --mps' if use_mps else ''})"


def selftest(dev: Device, lib: Library) -> str:
    """The selftest's row: two rank processes under MPS on ``dev``'s GPU where the NCCL in ``lib``
    can put two ranks on one GPU, else on the first two GPUs. Unavailable, with the reason and
    the fix, where that cannot run: AMD's GPU, no MPS, a daemon already running, a single GPU
    NCCL cannot share, or the selftest itself a rank of a launch."""
    from ..nccl.config import check_shared_gpu
    if launch_env().source is not None:
        raise Unavailable("the selftest runs as a rank of a launch, and this check starts a launch of its own",
                          "run python -m shimrt.selftest outside a launcher")
    if dev.backend != "cuda":
        raise Unavailable(f"MPS is NVIDIA's, and this GPU is run by {dev.backend}")
    status()  # Unavailable where MPS is not installed
    daemons = mps.running(mps.find_control())
    if daemons:
        raise Unavailable(f"an MPS daemon already runs: {'; '.join(map(str, daemons))}, and python -m "
                          "shimrt.launch --mps starts its own only where none does",
                          "stop it (echo quit | CUDA_MPS_PIPE_DIRECTORY=<its pipe folder> nvidia-cuda-mps-control)")
    try:
        check_shared_gpu(lib, dev.backend, "two rank processes on one GPU")
        devices = [dev.index, dev.index]
    except CollectiveError as exc:
        if dev.device_count() < 2:
            raise Unavailable(f"this machine has 1 GPU: {exc}", _SHARE_FIX) from None
        devices = [0, 1]
    return run(devices)


if __name__ == "__main__":
    # The rank side: under python -m shimrt.launch (see the module's docstring). Run alone, it is
    # one rank of one; what it lacks (a GPU, NCCL) is said in one line, exit 2, as by every command.
    from .. import cli
    sys.exit(cli.main(cli.parser("python -m shimrt.launch.mpscheck", __doc__), run=lambda args: main()))
