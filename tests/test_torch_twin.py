"""The DDP twin auto times its hooked policies through (shimrt.torch.twin), on the CPU: real DDPs
over gloo, the twin built from the user's DDP, taking turns with it step by step."""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shimrt import UsageError

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("view", [False, True])
def test_a_ddp_and_its_twin_taking_turns_train_as_plain_ddp_bit_for_bit(view):
    """Two ranks: odd steps through the twin (its hook all-reduces), even ones through the user's
    DDP (no hook, its own all-reduce); a no_sync() step inside a routed one all-reduces nothing;
    the parameters end as a plain DDP copy's, bit for bit; once closed, the twin's hooks are off
    the parameters and the user's DDP never had one."""
    pytest.importorskip("torch")
    port = str(_free_port())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = ["--bucket-view"] if view else []
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "twin_ranks.py"), str(r), port, *argv],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for rank, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, out[-3000:]
        # 4 routed steps of 6-7 buckets (the first before DDP rebuilt its buckets), one of them no_sync
        line = next(x for x in out.splitlines() if x.startswith(f"rank {rank}:"))
        assert line == f"rank {rank}: diff 0.0 routed 13 plain 0 after-close 0 user hooks 0", out[-3000:]


@pytest.fixture
def gloo():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed is unavailable or already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield torch
    finally:
        dist.destroy_process_group()


def test_the_twin_is_built_with_the_users_ddp_arguments(gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.twin import constructor_arguments
    torch = gloo
    signature = inspect.signature(DDP.__init__)
    default = constructor_arguments(DDP(torch.nn.Linear(4, 4)), signature)
    assert "bucket_cap_mb" not in default  # DDP's default buckets (and its small first one) stay the default
    assert default.get("init_sync") is False and default["gradient_as_bucket_view"] is False
    assert default["find_unused_parameters"] is False and default["static_graph"] is False
    ddp = DDP(torch.nn.Linear(4, 4), bucket_cap_mb=100, gradient_as_bucket_view=True, find_unused_parameters=True)
    got = constructor_arguments(ddp, signature)
    assert got["bucket_cap_mb"] == 100 and got["gradient_as_bucket_view"] and got["find_unused_parameters"]
    twin = DDP(ddp.module, **got)
    assert twin.bucket_bytes_cap == ddp.bucket_bytes_cap and twin.gradient_as_bucket_view
    assert set(got) <= set(signature.parameters)


def test_what_a_twin_cannot_mirror_is_refused_with_the_reason(gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.twin import Twin, unsupported
    torch = gloo
    ddp = DDP(torch.nn.Linear(4, 4))
    assert unsupported(ddp) is None
    ddp.mixed_precision = object()  # as DDP(mixed_precision=...) leaves it
    assert "mixed_precision" in unsupported(ddp)
    with pytest.raises(UsageError, match="auto cannot time its policies beside this DDP: its mixed_precision.*"
                                         "give overlap\\(\\) a fixed policy"):
        Twin(ddp, None, lambda state, bucket: None)


def test_a_closed_twin_routes_nothing(gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.twin import Twin
    torch = gloo
    ddp = DDP(torch.nn.Linear(4, 4))
    twin = Twin(ddp, None, lambda state, bucket: None)
    with twin.routed():
        assert "forward" in vars(ddp)
    assert "forward" not in vars(ddp)  # the user's DDP's own forward again
    twin.close()
    twin.close()  # twice is fine
    with pytest.raises(UsageError, match="the twin is closed"):
        with twin.routed():
            pass
