"""One rank of DDP over NCCL (world size 1) under shimrt.torch.overlap, beside a plain DDP copy
trained on the same data: what tests/gpu/test_ddp.py's one-rank cases check, printed as JSON.

Usage: python ddp_one_rank.py POLICY MARGIN STEPS [second|mixed]

STEPS steps at least; under auto, on until it keeps a policy.

``second``: then overlap() B under carveout:32 while the first (A) holds its group, A closed,
auto C while B's group lives, and auto D after every one is closed (torch names groups; a name
made twice is refused).
``mixed``: both DDPs with DDP's own ``mixed_precision`` (bf16 parameters and reduction).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shimrt.torch


def mlp(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512),
                               torch.nn.GELU(), torch.nn.Linear(512, 512)).to(device)


#: auto's trials take as many steps as its candidates and its check need (the block check alone
#: 56 with Auto(trial_steps=1)): auto runs until it decides, at most this many steps.
MOST_STEPS = 1000
#: Steps the kept policy runs at least (auto's after it decided) before what is left is read: the
#: job trained on, as a user's would, not the instant of the decision.
KEPT_STEPS = 12


def decided(ov) -> bool:
    """Whether ``ov`` runs a policy it keeps (a fixed one from the first step; auto once decided)."""
    return ov.report()["policy"] is not None


def left_behind(report: dict, blas, device: torch.device) -> dict:
    """What of the trials is left once a policy is kept (``ov.report()``'s ``report``), beside
    torch's global knobs they touch: ``blas``, the BLAS library preferred before overlap()."""
    return dict(report["held"], nccl_groups=report["nccl_memory"]["alive"],
                carveout=torch._C._get_sm_carveout_experimental(),
                blas_restored=torch.backends.cuda.preferred_blas_library() == blas,
                reserved_mib=torch.cuda.memory_reserved(device) / 2**20)


def main() -> None:
    policy, margin, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    second, mixed = sys.argv[4:] == ["second"], sys.argv[4:] == ["mixed"]
    blas = torch.backends.cuda.preferred_blas_library()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    more = {}
    if mixed:  # DDP's own mixed precision: its comm hook all-reduces through the reducer's group
        from torch.nn.parallel.distributed import _MixedPrecision
        more["mixed_precision"] = _MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    model = DDP(mlp(device), device_ids=[0], bucket_cap_mb=1, **more)
    plain = DDP(mlp(device), device_ids=[0], bucket_cap_mb=1, **more)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=1e-2)
    own = model.process_group
    chosen = shimrt.torch.Auto(trial_steps=1, margin=margin) if policy == "auto" else policy
    ov = shimrt.torch.overlap(model, policy=chosen, timeout=60)
    groups_seen = set()
    idle = []  # after each ov.step(): whether the GPU had done the step (paced waits for it)
    kept_steps = 0  # steps run under the policy kept (auto's after its decision): the state read after KEPT_STEPS
    for step in range(MOST_STEPS):
        if step >= steps and kept_steps >= KEPT_STEPS:
            break
        kept_steps += decided(ov)
        x = torch.randn(256, 512, device=device, generator=torch.Generator(device).manual_seed(step))
        with ov.step():
            groups_seen.add(id(model.process_group))
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        idle.append(torch.cuda.current_stream(device).query())
        plain(x).pow(2).mean().backward()
        plain_opt.step()
        plain_opt.zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), plain.parameters(), strict=True))
    report = ov.report()
    group = model.process_group
    high = group._get_backend(device).options.is_high_priority_stream
    left = left_behind(report, blas, device)
    seconds = []
    if second:
        # torch 2.11 named a group made by some ranks by the count of groups alive: with A's group
        # and then B's made, A closed, a group made next took B's name while B still held it.
        def auto_run() -> str | None:
            other = DDP(mlp(device), device_ids=[0], bucket_cap_mb=1)
            ov3 = shimrt.torch.overlap(other, policy=shimrt.torch.Auto(sms=(32,), trial_steps=1), timeout=60)
            for i in range(MOST_STEPS):
                if i >= 6 and decided(ov3):
                    break
                with ov3.step():
                    other(torch.randn(256, 512, device=device)).pow(2).mean().backward()
            kept = ov3.report()["policy"]
            ov3.close()
            return kept
        b_model = DDP(mlp(device), device_ids=[0], bucket_cap_mb=1)
        b = shimrt.torch.overlap(b_model, policy="carveout:32", timeout=60)  # B's group, made after A's
        ov.close()                                                            # A's group goes
        seconds.append(auto_run())                                            # C's groups while B's lives
        b.close()
        seconds.append(auto_run())                                            # D's after every one closed
    ov.close()
    print(json.dumps({"policy": report["policy"], "process_group": report["process_group"],
                      "own_group": group is own, "high_priority": high, "groups_seen": len(groups_seen),
                      "own_group_after_close": model.process_group is own, "hooks": len(model._comm_hooks),
                      "reference": report["reference"], "host_us": report["host_us"], "diff": diff,
                      "left": left, "nccl_memory": report["nccl_memory"], "trials": report["trials"],
                      "seconds": seconds, "idle_after_steps": all(idle)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
