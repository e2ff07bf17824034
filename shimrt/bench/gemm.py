"""Compare shimrt's SGEMM with the vendor BLAS (cuBLAS or rocBLAS) in FP32, side by side in one run.

shimrt's sgemm is kernels_src/workloads.cu's; the vendor column is cuBLAS (rocBLAS on HIP)
through torch.matmul with TF32 off, or through cupy.matmul when torch is missing (CuPy computes
float32 products in FP32 unless CUPY_TF32 is set). Both multiply the same device matrices, on
the same shimrt stream, and are timed with device events around each launch, the two methods
alternating; medians over the repeats. Before timing, shimrt's result is checked against the
vendor's.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import numpy as np

from .. import cli, validate
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..overlap import workloads
from ..overlap.workloads import ComputeSpec, ComputeWorkload

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench gemm``."""
    p.add_argument("--size", metavar="N", type=validate.argument(sgemm_size, "--size"), default=4096,
                   help="M = N = K, a positive multiple of 128 (default 4096)")
    p.add_argument("--repeats", metavar="N", type=cli.count("--repeats", 1),
                   default=20, help="timed launches per method, at least 1 (default 20)")
    p.add_argument("--warmup", metavar="N", type=cli.count("--warmup", 0),
                   default=3, help="untimed launches per method first, at least 0 (default 3)")
    cli.add_json(p)
    p.set_defaults(run=run)


def sgemm_size(value: Any, what: str = "size") -> int:
    """``value`` (an int, or its command-line text) when ComputeSpec takes it as an sgemm size."""
    size = cli.integer_text(value, what) if isinstance(value, str) else value
    try:
        return ComputeSpec("sgemm", size).size
    except UsageError as exc:
        raise cli.renamed(exc, "size", what) from None


def _library() -> tuple[str, Any]:
    """("torch", torch) or ("cupy", cupy), whichever imports first; ShimrtError if neither."""
    try:
        import torch
        return "torch", torch
    except ImportError:
        pass
    try:
        import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]  # optional; no stubs
        return "cupy", cupy
    except ImportError:
        raise ShimrtError("neither torch nor CuPy is installed: the vendor BLAS column needs one of them") from None


def _vendor(dev: Device, wl: ComputeWorkload, stream, library):
    """(name, function launching C = A @ B on ``stream``, function returning C on the host)."""
    blas = "cuBLAS" if dev.backend == "cuda" else "rocBLAS"
    a, b = wl.buffers["A"], wl.buffers["B"]
    kind, lib = library
    if kind == "torch":
        lib.backends.cuda.matmul.allow_tf32 = False  # FP32 products, not TF32
        lib.set_float32_matmul_precision("highest")
        ta, tb = lib.from_dlpack(a), lib.from_dlpack(b)
        tc = lib.empty_like(ta)
        tstream = lib.cuda.ExternalStream(stream.handle, device=ta.device)

        def torch_launch():
            with lib.cuda.stream(tstream):
                lib.matmul(ta, tb, out=tc)

        def torch_result():
            tstream.synchronize()
            return tc.cpu().numpy()
        return f"{blas} FP32 (torch {lib.__version__}, TF32 off)", torch_launch, torch_result
    if os.environ.get("CUPY_TF32", "0") != "0":
        raise ShimrtError("CUPY_TF32 is set: unset it so that CuPy multiplies in FP32")
    ca, cb = lib.asarray(a), lib.asarray(b)
    cc = lib.empty_like(ca)
    cstream = lib.cuda.ExternalStream(stream.handle)

    def launch():
        with cstream:
            lib.matmul(ca, cb, out=cc)

    def result():
        cstream.synchronize()
        return lib.asnumpy(cc)
    return f"{blas} FP32 (CuPy {lib.__version__})", launch, result


def measure(size: int = 4096, repeats: int = 20, warmup: int = 3, device: Device | None = None) -> dict:
    """Median times and TFLOP/s of shimrt's sgemm and the vendor's on ``size`` x ``size`` matrices."""
    spec = ComputeSpec("sgemm", size)  # bad sizes and a missing library fail before the GPU is touched
    repeats = validate.integer(repeats, "repeats", least=1)
    warmup = validate.integer(warmup, "warmup", least=0)
    library = _library()
    dev = device or Device()
    wl = ComputeWorkload(dev, spec)
    stream = dev.stream()
    vendor, vendor_launch, vendor_result = _vendor(dev, wl, stream, library)
    methods = {"shimrt sgemm": lambda: wl.launch(stream), vendor: vendor_launch}

    # Checked against each other before timing, on the scale check() uses: |A| @ |B| per element.
    for launch in methods.values():
        launch()
    stream.synchronize()
    mine, theirs = wl.output.numpy(stream=stream), vendor_result()
    host = wl.host
    scale = np.abs(host["A"]) @ np.abs(host["B"])
    difference = float(np.max(np.abs(mine.astype(np.float64) - theirs) / scale))
    if not difference <= 2 * workloads.tolerance(spec):
        raise ShimrtError(f"shimrt's sgemm differs from {vendor} by {difference:.3g} (normalised), more than "
                          f"twice the tolerance {workloads.tolerance(spec):.3g}")

    times: dict[str, list[float]] = {name: [] for name in methods}
    events = [(dev.event(), dev.event()) for _ in methods]
    for i in range(warmup + repeats):
        for (name, launch), (start, end) in zip(methods.items(), events, strict=True):
            start.record(stream)
            launch()
            end.record(stream)
            end.synchronize(timeout=60)
            if i >= warmup:
                times[name].append(start.elapsed_ms(end))
    flops = wl.flops
    result = {"device": dev.name, "size": size, "repeats": repeats, "vendor": vendor,
              "normalised_difference": difference, "methods": {}}
    for name, ms in times.items():
        median = statistics.median(ms)
        result["methods"][name] = {"median_ms": median, "tflops": flops / median / 1e9, "times_ms": ms}
    result["ratio"] = result["methods"]["shimrt sgemm"]["tflops"] / result["methods"][vendor]["tflops"]
    return result


def report(result: dict) -> str:
    """The table of a :func:`measure` result."""
    n = result["size"]
    lines = [f"sgemm {n} x {n} x {n} float32 on {result['device']}: median of {result['repeats']} "
             f"(device events); results agree to {result['normalised_difference']:.2g} (normalised)",
             f"{'method':48s} {'ms':>9s} {'TFLOP/s':>9s}"]
    for name, m in result["methods"].items():
        lines.append(f"{name:48s} {m['median_ms']:9.3f} {m['tflops']:9.2f}")
    lines.append(f"shimrt / {result['vendor'].split()[0]}: {result['ratio']:.3f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``bench gemm``: measure, print, write --json."""
    result = measure(args.size, args.repeats, args.warmup)
    return cli.finish(report(result), result, args.json)
