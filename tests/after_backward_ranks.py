"""One rank of tests/test_torch_groups.py's two-rank run of the sequential policy (gloo, CPU): a
DDP whose gradients shimrt.torch.ddp.AfterBackward all-reduces after backward, beside a plain DDP
copy, through a no_sync() step, a forward without grad, a backward that fails midway, and back to
DDP's reducer after close(); then DDPs whose output is a dataclass, or an object of no container
kind, the same way, with torch.autograd.grad on rank 0 alone; prints what the test checks.

Usage: python after_backward_ranks.py RANK PORT
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from shimrt.torch.ddp import AfterBackward


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("boom")


class Trap(torch.nn.Module):
    """Passes its input on; while armed, its backward fails (below the DDP's output)."""

    armed = False

    def forward(self, x):
        return Boom.apply(x) if self.armed else x


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    # a buffer DDP broadcasts at each synced step's forward (BatchNorm's running stats), several buckets
    return torch.nn.Sequential(torch.nn.Linear(32, 32), Trap(), torch.nn.BatchNorm1d(32),
                               *[torch.nn.Linear(32, 32) for _ in range(4)])


@dataclasses.dataclass
class Out:
    y: torch.Tensor


class Wrapped(torch.nn.Module):
    """A model whose output is a dataclass, or an object of no container kind."""

    def __init__(self, boxed: bool):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.boxed = torch.nn.Linear(32, 32), boxed

    def forward(self, x):
        y = self.lin(x)
        return type("Box", (), {"y": y})() if self.boxed else Out(y)


def apart(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters(), strict=True))


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    # 3.5 KiB buckets: each 4 KiB weight is all-reduced alone, in place; biases and BatchNorm.s in one flat buffer
    user, plain = DDP(model(), bucket_cap_mb=0.0035), DDP(model(), bucket_cap_mb=0.0035)
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (user, plain)}
    deferred = AfterBackward(user)
    seen = []
    for step in range(10):
        if step == 8:
            deferred.close()  # DDP's reducer all-reduces again from here
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10 * step + rank))
        if step == 6:  # a backward that fails below the output, on both ranks, then training on
            user.module[1].armed = True
            try:
                user(x).pow(2).mean().backward()
            except RuntimeError:
                pass
            user.module[1].armed = False
            opts[id(user)].zero_grad()
            with plain.no_sync():
                plain(x)  # BatchNorm's running stats as the failed step left the user's
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
    diff = apart(user, plain)
    buffers = max((a.float() - b.float()).abs().max().item()
                  for a, b in zip(user.buffers(), plain.buffers(), strict=True))
    # the ranks' parameters apart: zero where every step's gradients were all-reduced
    mine = torch.cat([p.detach().reshape(-1) for p in user.parameters()])
    theirs = mine.clone()
    dist.broadcast(theirs, src=0)
    outputs = []
    for boxed in (False, True):
        a, b = DDP(Wrapped(boxed)), DDP(Wrapped(boxed))
        hold = AfterBackward(a)
        for step in range(3):
            x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10 * step + rank))
            if step == 1 and rank == 0:  # gradients taken on one rank alone: nothing accumulated, nothing reduced
                torch.autograd.grad(a(x).y.sum(), list(a.parameters()))
            for ddp in (a, b):
                ddp(x).y.pow(2).mean().backward()
                with torch.no_grad():
                    for p in ddp.parameters():
                        p -= 0.1 * p.grad
                        p.grad = None
        hold.close()
        outputs.append(apart(a, b))
    print(f"rank {rank}: diff {diff} buffers {buffers} ranks apart {(mine - theirs).abs().max().item()} "
          f"sync flags {sorted(set(seen))} no_sync kept {seen[8:10]} dataclass, boxed {outputs}", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # as tests/test_torch_ddp's ranks: no interpreter teardown racing gloo's threads


if __name__ == "__main__":
    main()
