"""A DDP rank under shimrt.torch.overlap whose peer exits mid-training (tests/gpu/test_ddp.py):
rank 1 leaves at step EXIT_AT; rank 0 must end with shimrt's CollectiveError within the timeout.
Usage: python ddp_peer_exits.py DEVICE EXIT_AT TIMEOUT (RANK, WORLD_SIZE, MASTER_* set)."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shimrt.torch
from shimrt import CollectiveError

device, exit_at, timeout = torch.device("cuda", int(sys.argv[1])), int(sys.argv[2]), float(sys.argv[3])
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
model = DDP(torch.nn.Linear(1024, 1024).to(device), device_ids=[device.index])
ov = shimrt.torch.overlap(model, "priority", timeout=timeout)
left = None
try:
    for step in range(200):
        if step == exit_at:
            if rank == 1:
                print("rank 1 leaves", flush=True)
                os._exit(3)
            left = time.monotonic()
        with ov.step():
            model(torch.randn(64, 1024, device=device)).sum().backward()
        torch.cuda.synchronize()
except CollectiveError as exc:
    if left is None:  # an error of its own, said as it is (not hidden behind the subtraction's TypeError)
        print(f"rank {rank}: CollectiveError before the peer left: {exc}", flush=True)
        os._exit(1)
    print(f"rank {rank}: CollectiveError {time.monotonic() - left:.1f} s after the peer left: {exc}", flush=True)
    os._exit(0)
print(f"rank {rank} never saw its peer leave", flush=True)
os._exit(1)
