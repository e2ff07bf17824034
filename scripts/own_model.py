"""A user's job that shimrt was not tuned for, under torchrun: plain DDP, then the same job with
``shimrt.torch.overlap(policy="auto")``, then plain DDP again, in one run (a check, not a test).

The model is a convolutional network (residual blocks of 3x3 convolutions, cuDNN's kernels, not
the transformers of bench torch), channels-last under bf16 autocast, SGD with momentum, the loss
read every 10 steps; each phase is a fresh DDP of the same weights, ``--warmup`` steps (auto: its
trials, then as many as remain), then ``--steps`` timed as a whole on the slowest rank.

    torchrun --standalone --nproc-per-node 2 scripts/own_model.py --steps 60
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import shimrt.torch


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.na, self.nb = nn.BatchNorm2d(c), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.nb(self.b(torch.relu(self.na(self.a(x))))))


def net(width: int, blocks: int, classes: int = 1000) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                         *[Block(width) for _ in range(blocks)], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, classes))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())  # two ranks on one GPU: both on 0
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch, 3, args.image, args.image, generator=g).to(device, memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), generator=g).to(device)

    def phase(name: str, policy: str | None) -> dict:
        torch.manual_seed(0)
        model = DDP(net(args.width, args.blocks).to(device, memory_format=torch.channels_last), device_ids=[device])
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        ov = shimrt.torch.overlap(model, policy=policy) if policy else None

        def step(i: int) -> None:
            with ov.step() if ov is not None else contextlib.nullcontext():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
            if (i + 1) % 10 == 0:
                loss.item()
        done = 0
        while ov is not None and ov.report()["policy"] is None:
            step(done)
            done += 1
        for i in range(done, max(done, args.warmup)):
            step(i)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(args.steps):
            step(i)
        torch.cuda.synchronize()
        ms = torch.tensor((time.perf_counter() - start) * 1e3 / args.steps, device=device, dtype=torch.float64)
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        out = {"way": name, "ms": ms.item(), "trial_steps": done}
        if ov is not None:
            report = ov.report()
            out.update(kept=report["policy"], check=report["trials"]["check"], means=report["trials"]["means_ms"],
                       nccl_memory=report["nccl_memory"])
            ov.close()
        if rank == 0:
            print(json.dumps(out), flush=True)
        return out

    runs = [phase("plain DDP", None), phase("auto", "auto"), phase("plain DDP again", None)]
    if rank == 0:
        base = (runs[0]["ms"] + runs[2]["ms"]) / 2
        print(f"plain DDP {runs[0]['ms']:.2f} / {runs[2]['ms']:.2f} ms, auto {runs[1]['ms']:.2f} ms "
              f"({runs[1]['ms'] / base:.3f}x their mean), kept {runs[1]['kept']}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(runs, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
