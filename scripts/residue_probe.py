"""What auto's trials leave behind (a diagnostic, not a test): one DDP trained on, segment after
segment, with each suspect applied alone between two plain segments.

One process per rank (python -m shimrt.launch --nproc 2 --devices 0,0 --mps, or torchrun). The
model is bench torch's (``--config``), fused AdamW, the loss read every 10 steps. Each segment
is ``--steps`` steps timed by CUDA events (the slowest rank's); a suspect is ``--visit`` steps
under a fixed policy through :func:`shimrt.torch.overlap`, then its ``close()``; the same DDP
then trains on plainly. ``auto`` runs auto's trials and is timed once kept; ``fresh`` is a new
DDP of the same weights. Rank 0 prints a line per segment: mean, median, min, max (ms).
``--fsdp``: the same with FSDP2 (``fully_shard`` of every block, then the model; foreach AdamW, as
bench torch's) in place of DDP; ``windowed-carveout`` is not offered there.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from shimrt.bench.torch_measure import step_times_ms
from shimrt.bench.torch_model import ModelSize, batch, build
from shimrt.bench.torch_step import CONFIGS
from shimrt.config import launch_env
from shimrt.torch import Auto, overlap


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="comm-heavy-1024", choices=list(CONFIGS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--visit", type=int, default=6)
    p.add_argument("--suspects", default=None,
                   help="comma-separated (default: priority,shaping:2,carveout:32,windowed-carveout:32 (not with "
                        "--fsdp),partition:32,auto,fresh)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) in place of DDP")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.suspects is None:
        windowed = [] if args.fsdp else ["windowed-carveout:32"]
        args.suspects = ",".join(["priority", "shaping:2", "carveout:32", *windowed, "partition:32", "auto", "fresh"])
    device = torch.device("cuda", launch_env().device)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    shape = CONFIGS[args.config]
    size = ModelSize(heads=max(1, shape["width"] // 128), **shape)

    def fresh():
        gc.collect()
        torch.cuda.empty_cache()
        model = build(size, device)
        if args.fsdp:
            from torch.distributed.fsdp import fully_shard
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ddp = DDP(model, device_ids=[device.index])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        return ddp, opt

    ddp, opt = fresh()
    data = batch(size, device, seed=1 + rank)

    def stepper(context=None):
        def step(i):
            if context is not None:
                with context():
                    loss = ddp(*data)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=False)
            else:
                loss = ddp(*data)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
            if (i + 1) % 10 == 0:
                loss.item()
            return loss.detach()
        return step

    results = []

    def segment(name, context=None, warmup=3):
        ms, _ = step_times_ms(torch, stepper(context), warmup, args.steps)
        t = torch.tensor(ms, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms = t.tolist()
        results.append({"segment": name, "ms": ms})
        if rank == 0:
            print(f"{name:44s} mean {statistics.fmean(ms):7.2f} median {statistics.median(ms):7.2f} "
                  f"min {min(ms):7.2f} max {max(ms):7.2f}  first/last 10: "
                  f"{statistics.fmean(ms[:10]):.2f}/{statistics.fmean(ms[-10:]):.2f}", flush=True)

    segment("plain (first)", warmup=10)
    segment("plain")
    for suspect in args.suspects.split(","):
        if suspect == "fresh":
            del ddp, opt
            ddp, opt = fresh()
            segment(f"fresh {'FSDP2' if args.fsdp else 'DDP'}, plain", warmup=10)
            continue
        if suspect == "auto":
            ov = overlap(ddp, Auto(sms=(32,)))
            step = stepper(ov.step)
            n = 0
            while ov.report()["policy"] is None:
                step(n)
                n += 1
            kept = ov.report()["policy"]
            segment(f"auto kept {kept} (after {n} trial steps)", ov.step)
            ov.close()
            segment("plain after auto closed")
            continue
        ov = overlap(ddp, suspect)
        step = stepper(ov.step)
        for i in range(args.visit):
            step(i)
        segment(f"fixed {suspect}", ov.step)
        ov.close()
        segment(f"plain after {suspect} closed")
    segment("plain (last)")
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "fsdp": args.fsdp, "segments": results}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
