"""Check what this machine can do with shimrt (compile, launch, overlap, communicate) and, where it cannot, why.

Sections: environment (MPS included), compile (every kernel for every target), device and
communication (only with a GPU; two rank processes under MPS too). Each check passes, fails, or
is skipped with the reason and what would fix it; a reason or fix shared by consecutive checks
is printed once (``--json`` repeats it on every check). The exit code is 0 when nothing failed
(``--strict``: and nothing was skipped), 1 when something did, 2 for a bad option or environment
variable.

About 410 lines: a short function per check, in the order the report prints them, each saying
its own reason and fix; the report and its command line close the module.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .. import __version__, backends, cli, compiler, kernels, occupancy, targets
from ..errors import CollectiveError, NoDeviceError, ShimrtError
from ..launch import mpscheck

__all__ = ["main", "run"]

if TYPE_CHECKING:
    from ..device import Device

COMPILE_TARGETS = ("sm_80", "sm_86", "sm_90", "gfx90a")


@dataclass
class Check:
    section: str
    name: str
    status: str          # "pass", "fail", "skip"
    detail: str = ""
    fix: str = ""
    seconds: float = 0.0


class _Skip(Exception):
    def __init__(self, reason: str, fix: str = ""):
        super().__init__(reason)
        self.fix = fix


def _run(section: str, name: str, fn, results: list, progress) -> object:
    t0 = time.perf_counter()
    value = None
    try:
        value = fn()
        status, detail, fix = "pass", value if isinstance(value, str) else "", ""
    except (_Skip, mpscheck.Unavailable) as s:
        status, detail, fix = "skip", str(s), s.fix
    except ShimrtError as exc:
        status, detail, fix = "fail", str(exc), ""
    except Exception as exc:  # a bug in shimrt or a binding: show where
        status, detail, fix = "fail", f"{type(exc).__name__}: {exc}\n" + traceback.format_exc(limit=3), ""
    results.append(Check(section, name, status, detail, fix, time.perf_counter() - t0))
    if progress:  # one line, rewritten in place and erased before the report: the report says it all
        print(f"\r\033[K  {len(results)} checks: {section}: {name} ({status})", end="", file=sys.stderr, flush=True)
    return value if status == "pass" else None


# --- environment ---------------------------------------------------------------------------

def check_environment(results: list, progress: bool) -> None:
    """The environment section's checks (Python, bindings, compilers, drivers, NCCL, MPS), appended to ``results``."""
    sec = "environment"
    _run(sec, "python", lambda: f"Python {platform.python_version()} ({sys.executable})", results, progress)
    _run(sec, "shimrt", lambda: f"shimrt {__version__}; numpy {np.__version__}; kernels in {kernels.directory()}",
         results, progress)

    for backend in backends.NAMES:
        _backend_environment(backend, results, progress)
    _run(sec, "MPS", mpscheck.status, results, progress)


# How to get each backend's libraries, for skips.
_FIX = {
    "cuda": "pip install 'shimrt[cuda]' (the GPU needs only its driver)",
    "hip": "pip install 'shimrt[hip]' and install ROCm; on Debian bookworm see the README's HIP section",
}
_LABEL = {"cuda": ("cuda-python", "NVRTC", "CUDA driver"), "hip": ("hip-python", "hipRTC", "HIP runtime")}
_VENDOR = {"cuda": "NVIDIA", "hip": "AMD"}
_NCCL_FIX = {"cuda": "pip install 'shimrt[nccl]' (or set SHIMRT_NCCL_LIBRARY)",
             "hip": "install RCCL with ROCm (or set SHIMRT_NCCL_LIBRARY / ROCM_PATH)"}


def _backend_environment(backend: str, results, progress):
    sec = "environment"
    bindings_label, rtc_label, driver_label = _LABEL[backend]

    def bindings():
        try:
            return backends.load(backend, "driver").binding_version()
        except ImportError:
            raise _Skip(f"{bindings_label} is not installed", _FIX[backend]) from None
    _run(sec, bindings_label, bindings, results, progress)

    def rtc():
        module = backends.load(backend, "rtc")
        try:
            return f"{module.version()} from {module.library_path()}"
        except NoDeviceError as exc:
            raise _Skip(str(exc), _FIX[backend]) from None
    _run(sec, rtc_label, rtc, results, progress)

    def driver():
        drv = backends.load(backend, "driver")
        try:
            drv.init()
        except NoDeviceError as exc:
            raise _Skip(f"no {_VENDOR[backend]} GPU: {exc}",
                        f"run on a machine with an {_VENDOR[backend]} GPU and its driver") from None
        return f"{driver_label} version {drv.version()} from {drv.library_path()}; {drv.device_count()} device(s)"
    _run(sec, driver_label, driver, results, progress)

    def collectives():
        from ..nccl import library
        try:
            lib = library.load(backend)
        except CollectiveError as exc:
            raise _Skip(str(exc), _NCCL_FIX[backend]) from None
        return f"{'RCCL' if backend == 'hip' else 'NCCL'} {lib.version_text} from {lib.path}"
    _run(sec, "RCCL" if backend == "hip" else "NCCL", collectives, results, progress)


# --- compile matrix -------------------------------------------------------------------------

def check_compile(results: list, progress: bool) -> None:
    """Every kernel source compiled for every target of COMPILE_TARGETS, appended to ``results``."""
    sec = "compile"
    for arch in COMPILE_TARGETS:
        for name in kernels.names():
            def one(arch=arch, name=name):
                target = targets.get(arch)
                try:
                    program = compiler.compile(kernels.source(name), target, name=name)
                except NoDeviceError as exc:  # the compiler's package or library is missing
                    raise _Skip(str(exc), _FIX[target.backend]) from None
                parts = []
                for k, r in sorted(program.resources.items()):
                    bs = min(256, r.max_threads_per_block)
                    occ = occupancy.occupancy(target, block_size=bs, registers=r.registers,
                                              static_smem=r.static_smem, sgprs=r.sgprs)
                    parts.append(f"{k}: {r.registers} regs, {r.static_smem} B smem, {r.spill_bytes} B spill, "
                                 f"{occ.blocks} blocks/SM at {bs} threads ({'/'.join(occ.limited_by)})")
                return "; ".join(parts) + (" (cached)" if program.from_cache else "")
            _run(sec, f"{name} for {arch}", one, results, progress)


# --- device --------------------------------------------------------------------------------

def check_device(results: list, progress: bool) -> Device | None:
    """The device section's checks (DEVICE_CHECKS); the Device they opened, or None without one."""
    sec = "device"
    from ..device import Device
    try:
        dev = Device()
    except ShimrtError as exc:
        failed = not isinstance(exc, NoDeviceError)  # a GPU is there but would not open: a failure, not a skip
        if failed:
            results.append(Check(sec, "open device", "fail", str(exc)))
        why, fix = (("the device did not open (see above)", "") if failed else
                    (f"no GPU: {exc}", "run on a machine with a GPU and its driver"))
        for name in DEVICE_CHECKS[failed:] + COMMUNICATION_CHECKS:
            results.append(Check("communication" if name in COMMUNICATION_CHECKS else sec, name, "skip", why, fix))
        return None
    results.append(Check(sec, "open device", "pass", f"{dev!r}: {dev.target.num_sms} SMs, "
                         f"{dev.target.smem_per_sm} B smem/SM, priorities {dev.priority_range}"))
    rng = np.random.default_rng()

    def launch():
        module = dev.load(dev.compile(kernels.source("vector_ops"), options=["--fmad=false"], name="vector_ops.cu"))
        n = 1 << 20
        x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        a = np.float32(rng.standard_normal())
        dx, dy = dev.to_device(x), dev.to_device(y)
        module["saxpy"].launch(256, 256, dy, dx, a, n)
        got, want = dy.numpy(), a * x + y
        if not np.array_equal(got, want):
            raise ShimrtError(f"saxpy: {np.count_nonzero(got != want)} of {n} elements differ from numpy")
        return f"saxpy on {n} elements equals numpy"
    _run(sec, "launch correctness", launch, results, progress)

    def big_smem():
        kernel = dev.load(dev.compile(kernels.source("smem_ops"), name="smem_ops.cu"))["reverse_tiles"]
        smem = min(dev.target.smem_per_block_optin, 200 * 1024) // 16 * 16
        tile, blocks = smem // 4, 2 * dev.target.num_sms
        x = rng.standard_normal(tile * blocks, dtype=np.float32)
        dx, dy = dev.to_device(x), dev.empty(x.shape, np.float32)
        kernel.launch(blocks, 512, dy, dx, tile, dynamic_smem=smem)
        if not np.array_equal(dy.numpy(), x.reshape(blocks, tile)[:, ::-1].ravel()):
            raise ShimrtError("reverse_tiles with large dynamic shared memory gave wrong results")
        return f"{smem} B of dynamic shared memory per block"
    _run(sec, "large dynamic shared memory", big_smem, results, progress)

    def priorities():
        least, greatest = dev.priority_range
        with dev.stream("high") as hi, dev.stream("low") as lo:
            if (hi.priority, lo.priority) != (greatest, least):
                raise ShimrtError(f"streams read back {hi.priority}/{lo.priority}, expected {greatest}/{least}")
        return f"greatest {greatest}, least {least}, read back from created streams"
    _run(sec, "stream priorities", priorities, results, progress)
    _run(sec, "shaping confirmed by the driver", lambda: _shaping_check(dev), results, progress)
    _run(sec, "overlap: prioritized comm beside shaped compute", lambda: _overlap_check(dev), results, progress)
    _run(sec, "SM partition", lambda: _partition_check(dev), results, progress)
    return dev


DEVICE_CHECKS = ["open device", "launch correctness", "large dynamic shared memory", "stream priorities",
                 "shaping confirmed by the driver", "overlap: prioritized comm beside shaped compute", "SM partition"]
COMMUNICATION_CHECKS = ["library", "single-rank collective", "N-rank collective",
                        "N-rank collective, processes under MPS"]


def _comm_standin(dev):
    """A communication stand-in: sm_probe blocks of 512 threads holding NCCL's shared memory."""
    from ..occupancy import NCCL_2_28_SM90, Footprint
    smem = min(NCCL_2_28_SM90.static_smem + NCCL_2_28_SM90.dynamic_smem,
               dev.target.smem_per_block_optin // 2)
    return Footprint("NCCL-sized stand-in", blocks=1, threads=512, registers=32, static_smem=0, dynamic_smem=smem)


def _shaping_check(dev) -> str:
    probe = dev.load(dev.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    natural = probe.max_active_blocks(256, 0)
    for n in range(1, natural + 1):
        probe.shape(256, resident_blocks=n)  # raises if the driver disagrees
    s = probe.shape(256, reserve=_comm_standin(dev))
    return (f"sm_probe at 256 threads: the driver confirms every cap 1..{natural}; beside an NCCL-sized block "
            f"{s.resident_blocks} fit(s) with {s.dynamic_smem} B of dynamic smem")


def _partition_check(dev) -> str:
    """Kernels launched into a partition of 16 SMs (green contexts, CU masks) stay on 16 SMs."""
    split, rest = dev.partition(16)
    try:
        probe = split.load(dev.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
        blocks = 4 * dev.target.num_sms
        sm, start, stop = dev.empty(blocks, np.uint32), dev.empty(blocks, np.uint64), dev.empty(blocks, np.uint64)
        with split.stream("high") as s:
            split.activate()
            probe.launch(blocks, 256, sm, start, stop, dev.timestamp_hz // 100000, stream=s)
            s.synchronize(timeout=30)
        used = len(set(sm.numpy().tolist()))
        if used > split.target.num_sms:
            raise ShimrtError(f"{blocks} blocks in a partition of {split.target.num_sms} SMs ran on {used} SMs")
        return (f"{blocks} blocks ran on {used} SMs of a {split.target.num_sms}-SM partition "
                f"({rest.target.num_sms} SMs left for the rest)")
    finally:
        dev.activate()
        split.close()
        rest.close()


def _overlap_check(dev) -> str:
    """A greatest-priority comm kernel, launched after a shaped single-wave compute kernel, must
    start before that kernel drains (timestamps from %globaltimer / wall_clock64)."""
    probe = dev.load(dev.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    standin = _comm_standin(dev)
    shaped = probe.shape(256, reserve=standin)  # also asks for the full shared-memory carveout
    sms, hz = dev.target.num_sms, dev.timestamp_hz

    def run(compute_smem, blocks_per_sm):
        c_blocks, m_blocks = sms * blocks_per_sm, 16
        cb = [dev.empty(c_blocks, np.uint32), dev.empty(c_blocks, np.uint64), dev.empty(c_blocks, np.uint64)]
        mb = [dev.empty(m_blocks, np.uint32), dev.empty(m_blocks, np.uint64), dev.empty(m_blocks, np.uint64)]
        with dev.stream("low") as lo, dev.stream("high") as hi:
            probe.launch(c_blocks, 256, *cb, 3 * hz // 1000, stream=lo, dynamic_smem=compute_smem)     # 3 ms per block
            probe.launch(m_blocks, standin.threads, *mb, hz // 10000, stream=hi, dynamic_smem=standin.dynamic_smem)
            lo.synchronize(timeout=30)
            hi.synchronize(timeout=30)
        c_start, c_stop, m_start = cb[1].numpy(), cb[2].numpy(), mb[1].numpy()
        t0 = int(c_start.min())
        return (int(m_start.max()) - t0) / hz * 1e3, (int(c_stop.min()) - t0) / hz * 1e3

    comm_at, first_done = run(shaped.dynamic_smem, shaped.resident_blocks)
    control_at, control_done = run(0, probe.max_active_blocks(256, 0))
    if comm_at >= first_done:
        raise ShimrtError(f"the prioritized comm kernel started {comm_at:.2f} ms after compute began, not before "
                          f"the shaped compute kernel's first block finished ({first_done:.2f} ms)")
    return (f"comm started {comm_at:.2f} ms after a shaped compute wave began (its blocks run {first_done:.2f} ms); "
            f"unshaped it started at {control_at:.2f} ms")


def check_communication(dev: Device | None, results: list, progress: bool) -> None:
    """The communication section's checks (COMMUNICATION_CHECKS) on ``dev`` (None: each skipped, said why)."""
    sec = "communication"
    if dev is None:
        return
    from ..nccl import Communicator, library, unique_id
    try:
        lib = library.load(dev.backend)
    except CollectiveError as exc:
        for name in COMMUNICATION_CHECKS:
            results.append(Check(sec, name, "skip", str(exc), _NCCL_FIX[dev.backend]))
        return
    results.append(Check(sec, "library", "pass", f"{lib.version_text} from {lib.path}"))
    rng = np.random.default_rng()

    def single():
        x = rng.standard_normal(1 << 20).astype(np.float32)
        with Communicator(dev, unique_id(lib), 0, 1) as comm:
            buf = dev.to_device(x)
            comm.all_reduce(buf, op="max")
            comm.wait(timeout=30)
            if not np.array_equal(buf.numpy(), x):
                raise ShimrtError("a single-rank all_reduce changed the data")
            return f"all_reduce of 4 MiB on a greatest-priority stream (priority {comm.stream.priority})"
    _run(sec, "single-rank collective", single, results, progress)

    def many():
        from ..config import device_map
        from ..launch import local_devices
        from ..nccl import group
        count = dev.device_count()
        try:  # one GPU and no map: two ranks on it, where this NCCL can do that
            devices = local_devices(dev, 2 if count < 2 and device_map() is None else None)
        except CollectiveError as exc:
            raise _Skip(f"this machine has {count} GPU{'s' if count != 1 else ''}: {exc}",
                        "run on a machine with several GPUs, or with NCCL 2.30+ (SHIMRT_NCCL_LIBRARY) and "
                        "NCCL_MULTI_RANK_GPU_ENABLE=1") from None
        if len(devices) < 2:
            raise _Skip(f"SHIMRT_DEVICES names one GPU: {devices[0].index}", "list two or more, e.g. 0,0")
        indices = [d.index for d in devices]
        comms = Communicator.local(devices)
        try:
            xs = [rng.standard_normal(1 << 18).astype(np.float32) for _ in comms]
            bufs = [c.device.to_device(x) for c, x in zip(comms, xs, strict=True)]
            with group(*comms):  # every rank on its own comm.stream
                for c, b in zip(comms, bufs, strict=True):
                    c.all_reduce(b)
            for c in comms:
                c.wait(timeout=60)
            want = np.sum(xs, axis=0, dtype=np.float32)
            for b in bufs:
                np.testing.assert_allclose(b.numpy(), want, rtol=1e-5, atol=1e-5)
            return f"all_reduce of {len(comms)} ranks in one process (GPUs {indices}) equals numpy"
        finally:
            for c in comms:
                c.close()
    _run(sec, "N-rank collective", many, results, progress)
    _run(sec, "N-rank collective, processes under MPS", lambda: mpscheck.selftest(dev, lib), results, progress)


# --- output ---------------------------------------------------------------------------------

def table(results: list[Check]) -> str:
    """The results for a person, a block per section. Where consecutive skipped checks share
    their fix, it is printed once after them, and so is their reason when that is shared too."""
    lines = []
    for section, rows in groupby(results, key=lambda r: r.section):
        lines.append(f"\n== {section}")
        for (status, fix), same in groupby(rows, key=lambda r: (r.status, r.fix if r.status == "skip" else "")):
            run = list(same)
            reasons = {_first_line(r.detail) for r in run}
            shared = status == "skip" and len(run) > 1 and len(reasons) == 1 and reasons != {""}
            for r in run:
                detail = "" if shared else _first_line(r.detail)
                lines.append(f"  [{r.status.upper():4s}] {r.name}" + (f": {detail}" if detail else ""))
                if r.status == "fail" and "\n" in r.detail:
                    lines.extend("         " + line for line in r.detail.splitlines()[1:])
            every = f" (all {len(run)} above)" if len(run) > 1 else ""
            if shared:
                lines.append(f"         why{every}: {reasons.pop()}")
            if fix:
                lines.append(f"         fix{every}: {fix}")
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
    lines.append(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    return "\n".join(lines)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shimrt.selftest [--json] [--strict] [--quiet]``; returns the exit code."""
    parser = cli.parser("python -m shimrt.selftest", __doc__)
    parser.add_argument("--json", action="store_true", help="print the results as JSON (every check with its fix)")
    parser.add_argument("--strict", action="store_true", help="count skipped checks as failures")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress line on stderr (there is one only where stderr is a terminal)")
    return cli.main(parser, argv, run)


def run(args: argparse.Namespace) -> int:
    """The selftest command: every section, its table (or --json), its exit code."""
    results: list[Check] = []
    progress = not args.quiet and sys.stderr.isatty()
    try:
        check_environment(results, progress)
        check_compile(results, progress)
        check_communication(check_device(results, progress), results, progress)
    finally:
        if progress:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results]}, indent=2))
    else:
        print(table(results))
    failed = any(r.status == "fail" for r in results) or (args.strict and any(r.status == "skip" for r in results))
    return 1 if failed else 0
