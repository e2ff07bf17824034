"""One rank of tests/test_torch_twin.py's two-rank run (gloo, CPU): a DDP and its shimrt twin take
turns, step by step, beside a plain DDP copy; prints what the test checks.

Usage: python twin_ranks.py RANK PORT [--bucket-view]
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from shimrt.torch.twin import Twin


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])


def hook(state, bucket):  # noqa: ANN001, ANN201 - DDP's hook signature
    state["calls"] += 1
    buf = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    view = "--bucket-view" in sys.argv
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    user = DDP(model(), bucket_cap_mb=0.004, gradient_as_bucket_view=view)
    plain = DDP(model(), bucket_cap_mb=0.004, gradient_as_bucket_view=view)
    state = {"calls": 0}
    twin = Twin(user, state, hook)
    opt = torch.optim.SGD(user.parameters(), lr=0.1, momentum=0.9)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    routed_calls = plain_calls = 0
    for step in range(8):
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10 * step + rank))
        before = state["calls"]
        with twin.routed() if step % 2 else contextlib.nullcontext():
            if step == 5:
                with user.no_sync():  # a no_sync step through the twin all-reduces nothing either
                    user(x).pow(2).mean().backward()
            else:
                user(x).pow(2).mean().backward()
        if step % 2:
            routed_calls += state["calls"] - before
        else:
            plain_calls += state["calls"] - before
        opt.step()
        opt.zero_grad()
        if step == 5:  # the plain copy accumulates that step's gradient alike
            with plain.no_sync():
                plain(x).pow(2).mean().backward()
        else:
            plain(x).pow(2).mean().backward()
        plain_opt.step()
        plain_opt.zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(user.parameters(), plain.parameters(), strict=True))
    twin.close()
    x = torch.randn(4, 32)
    before = state["calls"]
    user(x).pow(2).mean().backward()  # the twin's hooks are off the parameters
    print(f"rank {rank}: diff {diff} routed {routed_calls} plain {plain_calls} after-close {state['calls'] - before} "
          f"user hooks {len(user._comm_hooks)}", flush=True)
    dist.destroy_process_group()
    # torch 2.13's gloo aborts now and then at the interpreter's exit after a Python hook's future
    # .then() ran ("terminate called without an active exception"; plain DDP with such a hook and
    # no twin does too): leave without the interpreter's teardown.
    os._exit(0)


if __name__ == "__main__":
    main()
