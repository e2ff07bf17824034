"""Host cost per kernel launch before and after each thing auto's trials make in a process (a
diagnostic, not a test): a torch add on 256 elements and a 256x256 matmul launched many times, host
microseconds per launch (the best of five loops), first in a fresh process, then after a CUPTI
Interposer was entered and closed (shaping), after CUPTI detached (cuptiFinalize) and an
Interposer again, after an SM carveout was set and restored (carveout), after an SM partition
(green context) was made and used (partition). A host-bound job (FSDP2's many small launches)
would run slower by what a residue adds per launch.

    python scripts/launch_cost_probe.py [--launches 5000]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import torch

import shimrt
from shimrt.cuda.trace import library_path
from shimrt.overlap.interpose import Interposer
from shimrt.torch import sm_carveout
from shimrt.torch import stream as torch_stream
from shimrt.torch.resources import Resources


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--launches", type=int, default=5000)
    args = p.parse_args()
    if args.launches < 1:
        p.error(f"--launches must be 1 or more, not {args.launches}")
    if library_path() is None:
        p.exit(1, "CUPTI does not load here (pip install nvidia-cuda-cupti): no Interposer to measure\n")
    dev = shimrt.Device(0)
    a = torch.ones(256, device="cuda")
    b = torch.ones(256, 256, device="cuda")

    def cost() -> dict:
        def loop(fn) -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.launches):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / args.launches * 1e6
        return {"add_us": round(min(loop(lambda: a.add_(1)) for _ in range(5)), 3),
                "matmul_us": round(min(loop(lambda: b @ b) for _ in range(5)), 3)}

    rows = [("fresh", cost()), ("fresh, again", cost())]
    ip = Interposer(dev, cap=2)
    with ip:
        a.add_(1)
    ip.close()
    rows.append(("after an Interposer entered and closed", cost()))
    cupti = ctypes.CDLL(library_path())
    rows.append((f"after cuptiFinalize (returned {cupti.cuptiFinalize()})", cost()))
    ip = Interposer(dev, cap=2)
    with ip:
        a.add_(1)
    ip.close()
    rows.append((f"after an Interposer again ({ip.launches} launch(es) seen)", cost()))
    rows.append((f"after cuptiFinalize again (returned {cupti.cuptiFinalize()})", cost()))
    with sm_carveout(32):
        b @ b
    rows.append(("after a carveout set and restored", cost()))
    res = Resources(dev, keep_partitions=True)
    part = res.partition(32)
    with torch.cuda.stream(torch_stream(part.stream)):
        a.add_(1)
    torch.cuda.synchronize()
    rows.append(("after an SM partition made and used", cost()))
    res.close()
    rows.append(("after the resources closed (the partition kept)", cost()))
    for name, c in rows:
        print(f"{name:56s} add {c['add_us']:7.3f} us/launch  matmul {c['matmul_us']:7.3f} us/launch", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
