"""Two ranks whose DDP is over a sub-group ([0]) of a device-bound world (tests/gpu/test_ddp.py):
rank 0 asks overlap() for a policy group, which would split the world's communicator that rank 1
never joins; it must be refused at once, with the reason, not hang. ``ddp`` (no group of shimrt's)
still runs. Usage: python ddp_subgroup.py GPU (RANK, WORLD_SIZE, MASTER_ADDR/PORT set)."""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shimrt.torch
from shimrt import UsageError

device = torch.device("cuda", int(sys.argv[1]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
sub = dist.new_group([0])  # every rank calls new_group; only rank 0 is in it
if rank == 0:
    ddp = DDP(torch.nn.Linear(64, 64).to(device), device_ids=[device.index], process_group=sub)
    try:
        shimrt.torch.overlap(ddp, "priority", timeout=20)
        print("rank 0: not refused", flush=True)
    except UsageError as exc:
        print(f"rank 0: refused: {exc}", flush=True)
    ov = shimrt.torch.overlap(ddp, "ddp", timeout=20)
    with ov.step():
        ddp(torch.randn(8, 64, device=device)).sum().backward()
    ov.close()
    print("rank 0: ddp ran", flush=True)
dist.barrier()
print(f"rank {rank}: done", flush=True)
dist.destroy_process_group()
