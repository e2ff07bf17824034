"""One rank of FSDP2 over NCCL (world size 1) under shimrt.torch.overlap, beside a plain FSDP2
copy trained on the same data: what tests/gpu/test_fsdp.py checks, printed as JSON.

Usage: python fsdp_one_rank.py POLICY MARGIN STEPS [ROUTE]   ROUTE: mesh (default) or custom

STEPS steps at least; under auto, on until it keeps a policy, then KEPT_STEPS more under it.
"""

from __future__ import annotations

import json
import logging
import sys

import torch
import torch.distributed as dist
from ddp_one_rank import (  # a sibling script (this one's folder is on sys.path)
    KEPT_STEPS,
    MOST_STEPS,
    decided,
    left_behind,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import shimrt.torch
from shimrt.torch.fsdp import param_groups, settings


def mlp(mesh) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                                  torch.nn.Linear(2048, 512)) for _ in range(3)]).cuda()
    for block in m:
        fully_shard(block, mesh=mesh)
    return fully_shard(m, mesh=mesh)


def main() -> None:
    policy, margin, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    route = sys.argv[4] if len(sys.argv) > 4 else "mesh"
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    mesh = init_device_mesh("cuda", (1,))
    model, plain = mlp(mesh), mlp(mesh)
    own = param_groups(model)[0].mesh_info.shard_process_group
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=1e-2)
    chosen = shimrt.torch.Auto(trial_steps=1, margin=margin) if policy == "auto" else policy
    blas = torch.backends.cuda.preferred_blas_library()
    ov = shimrt.torch.overlap(model, policy=chosen, timeout=60, fsdp_route=route)
    kept_steps = 0  # steps run under the policy kept (auto's after its decision): the state read after KEPT_STEPS
    for step in range(MOST_STEPS):
        if step >= steps and kept_steps >= KEPT_STEPS:
            break
        kept_steps += decided(ov)
        x = torch.randn(256, 512, device=device, generator=torch.Generator(device).manual_seed(step))
        with ov.step():
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        plain(x).pow(2).mean().backward()
        plain_opt.step()
        plain_opt.zero_grad()
    torch.cuda.synchronize()
    diff = max((a.to_local() - b.to_local()).abs().max().item()
               for a, b in zip(model.parameters(), plain.parameters(), strict=True))
    report = ov.report()
    g = param_groups(model)[0]
    stream = g.comm_ctx.reduce_scatter_stream

    def on_own() -> bool:
        """The collectives run on FSDP2's own group: the mesh's group (the mesh route), or FSDP2's
        own all-gather (the custom route's taken out: the plain job) or shimrt's on that group."""
        gather = g._all_gather_comm  # what set_custom_all_gather set (FSDP2 has no public getter)
        if type(gather).__name__.startswith("Default"):
            return g.mesh_info.shard_process_group is own
        return gather.group is own
    on_own_before = on_own()

    # what of the trials is left once a policy is kept: the model's FSDP2 state beside the plain
    # copy's (the same mesh, so the same group; its "gathered": each block k, kept all-gathered
    # after forward, or r, resharded), and torch's global knobs the policies touch
    state, plain_state = settings(model), settings(plain)
    left = left_behind(report, blas, device)
    ov.close()
    print(json.dumps({"policy": report["policy"], "process_group": report["process_group"], "own_group": on_own_before,
                      "stream_priority": stream.priority, "least": max(torch.cuda.Stream.priority_range()),
                      "own_group_after_close": on_own(),
                      "mesh_untouched": g.mesh_info.shard_process_group is own,
                      "gathered": state["gathered"], "gathered_after_close": settings(model)["gathered"],
                      "reference": report["reference"], "host_us": report["host_us"],
                      "dropped": report["dropped"], "diff": diff, "state": state, "plain_state": plain_state,
                      "left": left, "trials": report["trials"]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
