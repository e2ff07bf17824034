"""One rank of tests/test_torch_groups.py's two-rank run of the sequential policy (gloo, CPU): a
DDP whose gradients shimrt.torch.ddp.AfterBackward all-reduces after backward, beside a plain DDP
copy, through a no_sync() step, a forward without grad, and back to DDP's reducer after close();
prints what the test checks.

Usage: python after_backward_ranks.py RANK PORT
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from shimrt.torch.ddp import AfterBackward


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    # a buffer DDP broadcasts at each synced step's forward (BatchNorm's running stats), several buckets
    return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32),
                               *[torch.nn.Linear(32, 32) for _ in range(4)])


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    user, plain = DDP(model(), bucket_cap_mb=0.004), DDP(model(), bucket_cap_mb=0.004)
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (user, plain)}
    deferred = AfterBackward(user)
    seen = []
    for step in range(10):
        if step == 7:
            deferred.close()  # DDP's reducer all-reduces again from here
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10 * step + rank))
        for ddp in (user, plain):
            if step == 3:
                with torch.no_grad():  # an evaluation: nothing taken, nothing reduced
                    ddp(x)
            if step == 4:
                with ddp.no_sync():  # accumulated, all-reduced with the next step's
                    ddp(x).pow(2).mean().backward()
                    seen.append(ddp.require_backward_grad_sync)
                continue
            ddp(x).pow(2).mean().backward()
            seen.append(ddp.require_backward_grad_sync)
            opts[id(ddp)].step()
            opts[id(ddp)].zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(user.parameters(), plain.parameters(), strict=True))
    buffers = max((a.float() - b.float()).abs().max().item()
                  for a, b in zip(user.buffers(), plain.buffers(), strict=True))
    # the ranks' parameters apart: zero where every step's gradients were all-reduced
    mine = torch.cat([p.detach().reshape(-1) for p in user.parameters()])
    theirs = mine.clone()
    dist.broadcast(theirs, src=0)
    print(f"rank {rank}: diff {diff} buffers {buffers} ranks apart {(mine - theirs).abs().max().item()} "
          f"sync flags {sorted(set(seen))} no_sync kept {seen[8:10]}", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # as tests/test_torch_ddp's ranks: no interpreter teardown racing gloo's threads


if __name__ == "__main__":
    main()
