"""One rank of tests/test_torch_groups.py's two-rank run (gloo, CPU): a DDP moved between process
groups by shimrt.torch.ddp.use, step by step, beside a plain DDP copy; prints what the test checks.

Usage: python groups_ranks.py RANK PORT [--bucket-view]
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from shimrt.torch.ddp import moveable, use


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    view = "--bucket-view" in sys.argv
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
    user = DDP(model(), bucket_cap_mb=0.004, gradient_as_bucket_view=view, process_group=first)
    plain = DDP(model(), bucket_cap_mb=0.004, gradient_as_bucket_view=view)
    opt = torch.optim.SGD(user.parameters(), lr=0.1, momentum=0.9)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    why = moveable(user)
    for step in range(10):
        if step < 6:
            use(user, second if step % 2 else first)  # the first step's, before DDP rebuilt its buckets, too
        elif step == 6:
            use(user, second)
            dist.destroy_process_group(first)  # the reducer all-reduces through second alone from here
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10 * step + rank))
        for ddp, o in ((user, opt), (plain, plain_opt)):
            if step == 5:
                with ddp.no_sync():  # accumulated, all-reduced with the next step's
                    ddp(x).pow(2).mean().backward()
                continue
            ddp(x).pow(2).mean().backward()
            o.step()
            o.zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(user.parameters(), plain.parameters(), strict=True))
    print(f"rank {rank}: diff {diff} moveable {why} on-second {user.process_group is second}", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # as tests/test_torch_ddp's ranks: no interpreter teardown racing gloo's threads


if __name__ == "__main__":
    main()
