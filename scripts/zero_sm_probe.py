"""Does NCCL run an all-gather on the copy engines here, holding no SMs? (a diagnostic, not a test)

NCCL 2.28+ runs AllGather on the GPU's copy engines when the communicator's CTA policy is ZERO
and the receive buffer lies in a symmetric window registered with the communicator; where a
requirement fails it falls back to its kernels without saying so (issue 42). torch 2.10+ reaches
both: ``ProcessGroupNCCL.Options().config.cta_policy`` and ``torch.distributed._symmetric_memory``
with the NCCL backend (whose memory pool registers the windows), which FSDP2's custom all-gather
could allocate from.

Run one process per rank, on GPUs of their own where there are two::

    python -m shimrt.launch --nproc 2 --devices 0,1 --timeout 150 scripts/zero_sm_probe.py

Two ranks on one GPU (``--devices 0,0 --mps``; NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1,
preloaded for torch: LD_PRELOAD) tell what NCCL does there: on an H100 (NCCL 2.32.3, torch
2.11, 71ad7d8) FSDP2's symmetric all-gather failed there with NCCL's invalid usage, and
``overlap()`` refuses zero-sm where ranks share a GPU. Each rank all-gathers ``--mib`` MiB
per rank, in place (as FSDP2 does: the send buffer is the rank's block of the receive buffer),
``--calls`` times under torch.profiler, into a plain buffer and into a symmetric one,
on a group of CTA policy ZERO; rank 0 prints per buffer the NCCL kernels and memory copies the
profiler saw, the time per all-gather, and whether every element is right. "copy engines: yes"
means the symmetric all-gather ran with no NCCL kernel and the right result.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path


def kernels_and_copies(path: Path) -> tuple[int, int]:
    """(NCCL kernels, GPU memory copies) in a Chrome trace of torch.profiler."""
    from shimrt.bench.torch_timeline import kind_of, load
    events = load(path).get("traceEvents") or []
    nccl = sum(1 for e in events if e.get("cat") == "kernel" and kind_of(e.get("name", "")) is not None)
    copies = sum(1 for e in events if e.get("cat") == "gpu_memcpy")
    return nccl, copies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, default=64, help="MiB each rank contributes (default 64)")
    p.add_argument("--calls", type=int, default=5, help="all-gathers per buffer under the profiler (default 5)")
    args = p.parse_args(argv)
    if not 1 <= args.mib <= 4096 or not 1 <= args.calls <= 100:
        print("zero_sm_probe.py: --mib must be 1..4096 and --calls 1..100", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("zero_sm_probe.py: needs torch (pip install 'shimrt[torch]')", file=sys.stderr)
        return 2
    from shimrt.bench.torch_timeline import record
    from shimrt.config import launch_env
    if not torch.cuda.is_available():
        print(f"zero_sm_probe.py: needs a CUDA GPU (torch {torch.__version__} sees none)", file=sys.stderr)
        return 2
    zero = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", None) if dist.is_nccl_available() else None
    options = dist.ProcessGroupNCCL.Options() if zero is not None else None
    if options is None or not hasattr(getattr(options, "config", None), "cta_policy"):
        print(f"zero_sm_probe.py: torch {torch.__version__} has no NCCL CTA policy (ProcessGroupNCCL.Options()."
              "config.cta_policy, torch 2.10+ built with NCCL 2.28+): copy-engine collectives cannot be asked for",
              file=sys.stderr)
        return 2
    options.config.cta_policy = zero
    device = torch.device("cuda", launch_env().device)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, pg_options=options, timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    from torch.distributed import _symmetric_memory as symm_mem
    symm_mem.set_backend("NCCL")
    dist.barrier()
    n = args.mib << 18  # float32 elements per rank
    expected = torch.arange(1, size + 1, device=device, dtype=torch.float32).repeat_interleave(n)
    rows = {}
    for kind in ("plain", "symmetric"):
        try:
            if kind == "plain":
                out = torch.empty(n * size, device=device)
            else:
                with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
                    out = torch.empty(n * size, device=device)
                symm_mem.rendezvous(out, group=dist.group.WORLD.group_name)
            # In place, as FSDP2 gathers: NCCL's copy engines need both buffers in the window.
            send = out.narrow(0, rank * n, n)
            send.fill_(float(rank + 1))
            dist.all_gather_into_tensor(out, send)  # the first call: set-up outside the trace
            torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as folder:
                path = record(torch, lambda i, out=out, send=send: dist.all_gather_into_tensor(out, send), args.calls,
                              Path(folder) / f"probe_{rank}.json.gz")
                kernels, copies = kernels_and_copies(path)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                dist.all_gather_into_tensor(out, send)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) / args.calls * 1e3
            right = bool(torch.equal(out, expected))
            rows[kind] = (kernels, copies, ms, right, None)
        except (RuntimeError, AttributeError, TypeError, ValueError) as exc:  # said, the other buffer goes on
            rows[kind] = (0, 0, float("nan"), False, f"{type(exc).__name__}: {exc}")
    if rank == 0:
        built = torch.cuda.nccl.version()
        built = ".".join(map(str, built)) if isinstance(built, tuple) else str(built)
        print(f"torch {torch.__version__}, NCCL {built} (built against), "
              f"{size} ranks, {args.mib} MiB per rank, CTA policy ZERO")
        for kind, (kernels, copies, ms, right, error) in rows.items():
            print(f"{kind:9s} " + (f"failed: {error}" if error else
                                   f"{kernels} NCCL kernels and {copies} memory copies in {args.calls} all-gathers, "
                                   f"{ms:.3f} ms each, every element {'right' if right else 'WRONG'}"))
        k, _, _, right, error = rows["symmetric"]
        print("copy engines: " + ("yes" if not error and right and k == 0 else
                                  "no (NCCL's kernels ran: a requirement failed and NCCL fell back)" if not error
                                  else "no (the symmetric buffer failed)"))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
