"""A DDP rank under shimrt.torch.overlap whose peer exits mid-training (tests/gpu/test_ddp.py):
rank 1 leaves at step EXIT_AT; rank 0, whose all-reduces on the policy's process group then never
complete, says every second that it is alive until torch's NCCL watchdog ends it (the group's
timeout). Usage: python ddp_peer_exits.py DEVICE EXIT_AT TIMEOUT [fsdp] (RANK, WORLD_SIZE, MASTER_* set);
fsdp: the model fully_shard-ed (FSDP2) in place of DDP."""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shimrt.torch

device, exit_at, timeout = torch.device("cuda", int(sys.argv[1])), int(sys.argv[2]), float(sys.argv[3])
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
if sys.argv[4:] == ["fsdp"]:
    from torch.distributed.fsdp import fully_shard
    model = fully_shard(torch.nn.Linear(1024, 1024).to(device))
else:
    model = DDP(torch.nn.Linear(1024, 1024).to(device), device_ids=[device.index])
ov = shimrt.torch.overlap(model, "priority", timeout=timeout)


def alive() -> None:
    for n in range(1, 1000):
        time.sleep(1)
        print(f"rank 0: alive {n} s after the peer left", flush=True)


for step in range(200):
    if step == exit_at:
        if rank == 1:
            print("rank 1 leaves", flush=True)
            os._exit(3)
        print("rank 0: the peer left", flush=True)
        threading.Thread(target=alive, daemon=True).start()
    with ov.step():
        model(torch.randn(64, 1024, device=device)).sum().backward()
    torch.cuda.synchronize()
print(f"rank {rank} never saw its peer leave", flush=True)
os._exit(0)
