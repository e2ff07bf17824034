"""Overlap in your DDP training: a plain DDP loop plus ``shimrt.torch.overlap`` (two lines).

One process per GPU, under torchrun or shimrt's launcher::

    torchrun --nproc-per-node 8 examples/ddp_overlap.py --policy auto
    python -m shimrt.launch --nproc 2 --devices 0,0 --mps \\
        examples/ddp_overlap.py --policy auto     # two ranks on one GPU (NCCL 2.30+, MPS)

``--fsdp`` trains with FSDP2 (``fully_shard``) in place of DDP. ``--compare`` also trains a plain
copy of the model on the same data, step for step, and says how far apart the two models'
parameters end (0: bit for bit). Rank 0 prints progress, the step time once auto has decided,
and what it kept.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import time

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:  # one line and exit 2, as shimrt's own commands say what is missing
    print("ddp_overlap.py: this example needs PyTorch: pip install 'shimrt[torch]'", file=sys.stderr)
    sys.exit(2)

import shimrt.launch
import shimrt.torch


def positive(kind: type) -> object:
    """An argparse type: a number of ``kind`` above 0."""
    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    return parse


def mlp(width: int, layers: int, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)  # every rank, and the plain copy, start from the same weights
    blocks = [m for _ in range(layers)
              for m in (torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))]
    return torch.nn.Sequential(*blocks).to(device=device, dtype=dtype)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="auto",
                   help="auto, ddp, priority, ctas:8, shaping:2, partition:48, carveout:48, ...")
    p.add_argument("--steps", type=positive(int), default=600,
                   help="training steps (default 600: auto's default trials take up to 471, a check that "
                        "cannot tell running to its 24 rounds, then both guards)")
    p.add_argument("--width", type=positive(int), default=2048)
    p.add_argument("--layers", type=positive(int), default=4)
    p.add_argument("--tokens", type=positive(int), default=1024, help="tokens per rank per step")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--timeout", type=positive(float), default=120.0,
                   help="seconds before a stuck collective is aborted")
    p.add_argument("--compare", action="store_true", help="train a plain copy beside it and compare")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard of every layer, then the model) in "
                                                      "place of DDP")
    p.add_argument("--fsdp-route", choices=("mesh", "custom"), default="mesh",
                   help="with --fsdp: how its collectives reach the policy's groups (overlap's fsdp_route)")
    args = p.parse_args()
    launch = shimrt.launch.environment()
    if launch.source not in ("torchrun", "shimrt"):
        p.error("run one process per GPU: torchrun --nproc-per-node N examples/ddp_overlap.py, or "
                "python -m shimrt.launch --nproc N examples/ddp_overlap.py")

    if not torch.cuda.is_available():  # a line per rank, not a traceback: the first to exit ends the others
        p.exit(2, f"{p.prog}: needs a CUDA GPU and torch built with CUDA (torch {torch.__version__} sees none)\n")
    index = launch.device  # torchrun's LOCAL_RANK, or the launcher's --devices
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    if rank == 0:  # what auto kept and its trials' means: the shimrt.torch logger, at INFO
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s: %(message)s")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def wrapped() -> torch.nn.Module:  # DDP, or FSDP2: the same two shimrt lines either way
        m = mlp(args.width, args.layers, dtype, device)
        if not args.fsdp:
            return DDP(m, device_ids=[index])
        from torch.distributed.fsdp import fully_shard
        for layer in m:
            if any(True for _ in layer.parameters()):
                fully_shard(layer)
        return fully_shard(m)

    model = wrapped()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    try:
        ov = shimrt.torch.overlap(model, policy=args.policy, timeout=args.timeout,  # + this line
                                  fsdp_route=args.fsdp_route)
    except shimrt.UsageError as exc:  # a policy this job cannot run: the reason, a line per rank
        dist.destroy_process_group()
        p.exit(2, f"{p.prog}: {exc}\n")
    if args.compare:
        plain = wrapped()
        plain_optimizer = torch.optim.SGD(plain.parameters(), lr=1e-3)

    data = torch.Generator(device=device)
    times = []
    for step in range(args.steps):
        data.manual_seed(1000 * rank + step)  # each rank its own batch
        x = torch.randn(args.tokens, args.width, generator=data, device=device, dtype=dtype)
        t0 = time.perf_counter()
        with ov.step():                                                                 # + this line
            loss = model(x).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()  # for the printed step time only; a real loop need not
        times.append(time.perf_counter() - t0)
        if args.compare:
            plain(x).float().pow(2).mean().backward()
            plain_optimizer.step()
            plain_optimizer.zero_grad()
        if rank == 0 and (step + 1) % 20 == 0:
            print(f"step {step + 1}/{args.steps}: loss {loss.item():.5f}", flush=True)

    report = ov.report()
    tried = report["trials"]["trial_steps"] if report["trials"] else 0
    kept = times[max(tried, args.steps - max(1, args.steps // 4)):]  # the last quarter, auto's trials not in it
    if rank == 0 and (report["policy"] is None or not kept):
        print(f"auto tries policies for {tried} steps: no step ran under the one it keeps in {args.steps}; "
              f"give more --steps")
    elif rank == 0:
        median = sorted(kept)[len(kept) // 2] * 1e3
        print(f"policy: {report['policy']} ({report['describe']}; process group: {report['process_group']}); "
              f"median step {median:.2f} ms over the "
              f"last {len(kept)} steps; ranks {report['ranks']}, {report['ranks_per_gpu']} per GPU")
        if report["dropped"]:
            print(f"dropped: {report['dropped']}")
    if args.compare:
        diff = torch.zeros((), device=device, dtype=torch.float64)
        for a, b in zip(model.parameters(), plain.parameters(), strict=True):
            if args.fsdp:  # each rank's shards
                a, b = a.to_local(), b.to_local()
            diff = torch.maximum(diff, (a.double() - b.double()).abs().max())
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        if rank == 0:
            plain_kind = "FSDP2" if args.fsdp else "DDP"
            print(f"parameters after {args.steps} steps: max |overlap - plain {plain_kind}| = {diff.item():.3g} "
                  f"({'bit for bit' if diff.item() == 0 else 'not bit for bit'})", flush=True)
    ov.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
