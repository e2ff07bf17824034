"""A user's job that shimrt was not tuned for, under torchrun: plain DDP, then the same job with
``shimrt.torch.overlap(policy="auto")`` (or ``--policy``'s), then plain DDP again, in one run (a
check, not a test).

Two models, neither the bench's ``nn.TransformerEncoderLayer`` stack:
- ``gpt`` (default): a decoder written out by hand as researchers write one (RMSNorm, causal
  ``scaled_dot_product_attention``, a SwiGLU MLP, a tied embedding), AdamW;
- ``cnn``: residual blocks of 3x3 convolutions with BatchNorm (cuDNN's kernels, DDP's buffer
  broadcast every forward), channels-last, SGD with momentum.
Both under bf16 autocast with the loss read every 10 steps. Each phase is a fresh DDP of the same
weights (``--fsdp``: FSDP2, ``fully_shard`` of every block and then the model, the optimizer over
its shards, against plain FSDP2), ``--warmup`` steps (auto: its trials, then as many as remain),
then two windows of ``--steps`` each timed as a whole on the slowest rank (the first, ``ms``, is what
earlier runs reported; the second, ``ms_later``, tells a transient in the first from the phase's own
speed: an H100 run at 8b70d5d had auto's FSDP2 phase 6-13% slower than plain FSDP2 in the window
right after auto decided, where its check had measured its pick 3-12% faster).

``--alternate N`` measures instead by blocks in turn: a plain model and the policy's model of the
same weights, both alive, each warmed up (auto: its trials to its decision), then ``--rounds``
rounds of N-step blocks in the order plain, policy, policy, plain, each block timed as a whole on
the slowest rank; the ratio is taken per round and averaged, so a drift of the host's or the GPU's
speed over the run (an H100 at 8d31cd5 ran the same FSDP2 steps with up to 29% more CPU time per
step from one window to the next, docs/ddp.md) weighs on both alike.

``--against kept`` sets auto, once it has decided, against a fresh model under the policy it kept,
fixed, in the same blocks in turn: a kept policy should read 1.00x its fixed self. ``--before
P1,P2`` runs a pair per policy whose measured model first runs ``--before-steps`` steps under it
(its overlap() then closed): with a fixed ``--policy X --against kept``, X after each P against X
fresh, what one policy leaves on a model for the next.

    torchrun --standalone --nproc-per-node 2 scripts/own_model.py --steps 60
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import shimrt.torch
from shimrt.bench.in_turn import blocks_reading, run_rounds


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.na, self.nb = nn.BatchNorm2d(c), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.nb(self.b(torch.relu(self.na(self.a(x))))))


def cnn(width: int, blocks: int, classes: int = 1000) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                         *[Block(width) for _ in range(blocks)], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, classes))


class Decoder(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, hidden = heads, 8 * d // 3
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate_up, self.down = nn.Linear(d, 2 * hidden, bias=False), nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(nn.functional.silu(gate) * up)


class Gpt(nn.Module):
    def __init__(self, d: int, layers: int, heads: int, vocab: int = 32000):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Decoder(d, heads) for _ in range(layers)])
        self.norm = nn.RMSNorm(d)

    def forward(self, tokens):
        return self.norm(self.blocks(self.embed(tokens))) @ self.embed.weight.t()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=("gpt", "cnn"), default="gpt")
    p.add_argument("--width", type=int, default=1024, help="gpt: model width; cnn: channels")
    p.add_argument("--blocks", type=int, default=12, help="decoder layers or residual blocks")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024, help="gpt: tokens per sequence")
    p.add_argument("--image", type=int, default=32, help="cnn: image side")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--link", choices=("native", "socket"), default="native",
                   help="socket: each rank a host of its own, NCCL's sockets over the loopback (shimrt.nccl.link)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard every block, then the model) in place "
                                                       "of DDP")
    p.add_argument("--fsdp-route", choices=("mesh", "custom"), default="mesh",
                   help="with --fsdp: how FSDP2's collectives reach auto's groups (overlap's fsdp_route)")
    p.add_argument("--policy", default="auto", help="what overlap() runs between the two plain phases: auto "
                   "(default), a policy's name such as paced or carveout:32, or several, comma-separated, one phase "
                   "each (auto,no-reshard: auto beside the fixed policy it may keep, in the same process)")
    p.add_argument("--alternate", type=int, default=0, metavar="N",
                   help="time each policy against plain DDP/FSDP2 in blocks of N steps in turn (plain, policy, "
                        "policy, plain per round), both models alive, in place of the phases one after the other")
    p.add_argument("--rounds", type=int, default=6, help="with --alternate: rounds of four blocks")
    p.add_argument("--before", default=None, metavar="POLICIES",
                   help="with --alternate: for each of these policies (comma-separated), a pair of its own whose "
                        "measured model first runs --before-steps steps under it, its overlap() then closed, before "
                        "the policy measured: what one policy leaves on a model for the next")
    p.add_argument("--before-steps", type=int, default=30, metavar="N", help="with --before: its steps (default 30)")
    p.add_argument("--against", choices=("plain", "kept"), default="plain",
                   help="with --alternate: the model beside each policy's, plain DDP/FSDP2 (default) or, for auto, "
                        "a fresh model under the policy auto kept, fixed, made once auto has decided: whether a kept "
                        "policy runs at its fixed speed, read in turn (a drift of the host's speed cancels)")
    p.add_argument("--diagnose", action="store_true",
                   help="per window: the process's and the main thread's CPU seconds, its threads, Python's "
                        "collector time, the caching allocator's retries and cudaMalloc/cudaFree counts, BLAS and FSDP2"
                        " state; a policy's phase also times a window after ov.close() on the same model (what a kept "
                        "policy's slowness is made of)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.alternate < 0 or args.rounds < 1:
        p.error(f"--alternate must be 0 or more and --rounds 1 or more, not {args.alternate} and {args.rounds}")
    if args.alternate and args.diagnose:
        p.error("--diagnose reads the phases one after the other; --alternate runs none: give one of them")
    if args.against == "kept" and not args.alternate:
        p.error("--against kept sets auto against its kept policy in blocks in turn: give --alternate N too")
    if args.before_steps < 1:
        p.error(f"--before-steps must be 1 or more (not {args.before_steps})")
    if args.before is not None and not args.alternate:
        p.error("--before runs pairs in blocks in turn: give --alternate N too")
    befores: list[str | None] = [None] if args.before is None else [b.strip() for b in args.before.split(",")]
    policies = [name.strip() for name in args.policy.split(",")]
    for name in policies + [b for b in befores if b is not None]:  # a name refused here, not after the first phase
        if name != "auto":
            try:
                shimrt.torch.policies.parse(name)
            except shimrt.UsageError as exc:
                p.error(str(exc))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.link != "native":  # before the first communicator: NCCL reads its variables once
        from shimrt.nccl.link import use_link
        use_link(args.link, int(os.environ.get("RANK", "0")))
    device = torch.device("cuda", local % torch.cuda.device_count())  # two ranks on one GPU: both on 0
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=90))
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1 + rank)
    if args.model == "gpt":
        x = torch.randint(0, 32000, (args.batch, args.seq + 1), generator=g).to(device)
        x, y = x[:, :-1], x[:, 1:].reshape(-1)
        make = lambda: Gpt(args.width, args.blocks, args.heads).to(device)  # noqa: E731
        # fused over DTensors is not every torch's: FSDP2's shards take foreach
        optimizer = lambda params: torch.optim.AdamW(params, lr=1e-4, fused=not args.fsdp)  # noqa: E731
    else:
        shape = (args.batch, 3, args.image, args.image)
        x = torch.randn(shape, generator=g).to(device, memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (args.batch,), generator=g).to(device)
        # FSDP2 shards contiguous parameters only: its model keeps them so (the input stays channels-last)
        layout = torch.contiguous_format if args.fsdp else torch.channels_last
        make = lambda: cnn(args.width, args.blocks).to(device, memory_format=layout)  # noqa: E731
        optimizer = lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9)  # noqa: E731

    def wrapped() -> nn.Module:
        if not args.fsdp:
            return DDP(make(), device_ids=[device])
        from torch.distributed.fsdp import fully_shard
        model = make()
        for block in (model.blocks if args.model == "gpt" else [m for m in model if isinstance(m, Block)]):
            fully_shard(block)
        return fully_shard(model)

    plain = "plain FSDP2" if args.fsdp else "plain DDP"

    collecting = [0.0, 0, 0.0]  # seconds in Python's collector, collections of the oldest generation, start

    def on_gc(what: str, info: dict) -> None:
        if what == "start":
            collecting[2] = time.perf_counter()
        else:
            collecting[0] += time.perf_counter() - collecting[2]
            collecting[1] += info.get("generation") == 2

    if args.diagnose:
        gc.callbacks.append(on_gc)

    def snapshot(model: nn.Module) -> dict:
        m = torch.cuda.memory_stats(device)
        out = {"gc_s": collecting[0], "gc_gen2": collecting[1], "cpu_s": time.process_time(),
               "main_thread_cpu_s": time.thread_time(), "threads": len(os.listdir("/proc/self/task")),
               "alloc_retries": m.get("num_alloc_retries", 0),
               "device_allocs": m.get("num_device_alloc", 0), "device_frees": m.get("num_device_free", 0),
               "reserved_gib": m.get("reserved_bytes.all.current", 0) / 2**30,
               "allocated_gib": m.get("allocated_bytes.all.current", 0) / 2**30,
               "free_gib": torch.cuda.mem_get_info(device)[0] / 2**30,
               "blas": str(torch.backends.cuda.preferred_blas_library()),
               "carveout": getattr(torch._C, "_get_sm_carveout_experimental", lambda: "n/a")()}
        if args.fsdp:
            from torch.distributed.fsdp import FSDPModule

            from shimrt.torch.fsdp import param_groups
            groups = param_groups(model)
            states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]
            ctx = groups[0].comm_ctx
            out.update(group_names=sorted({g.mesh_info.shard_process_group.group_name for g in groups}),
                       resharding=sum(g.post_forward_mesh_info is not None for g in groups),
                       prefetch=sum(len(s._states_to_forward_prefetch) + len(s._states_to_backward_prefetch)
                                    for s in states),
                       stream_priorities=[getattr(getattr(ctx, n, None), "priority", None)
                                          for n in ("all_gather_copy_in_stream", "all_gather_stream",
                                                    "reduce_scatter_stream", "all_reduce_stream")])
        return out

    def change(before: dict, after: dict) -> dict:
        counted = ("gc_s", "gc_gen2", "cpu_s", "main_thread_cpu_s", "alloc_retries", "device_allocs", "device_frees")
        return {k: (round(after[k] - before[k], 4) if k in counted else after[k]) for k in after}

    def fresh(policy: str | None, before: str | None = None):
        """A model of the same weights, its optimizer, and overlap() under ``policy`` (None: plain);
        ``before``: the model first runs --before-steps steps under that policy, its overlap() closed."""
        torch.manual_seed(0)
        model = wrapped()
        opt = optimizer(model.parameters())
        route = args.fsdp_route if args.fsdp else "mesh"
        if before is not None:
            first = Stepper(model, opt, shimrt.torch.overlap(model, policy=before, fsdp_route=route))
            for i in range(args.before_steps):
                first(i)
            first.ov.close()
        ov = shimrt.torch.overlap(model, policy=policy, fsdp_route=route) if policy else None
        return model, opt, ov

    def warm(step) -> int:
        """auto's trials to its decision (none for plain), then --warmup steps in all; the trial steps."""
        done = 0
        while step.ov is not None and step.ov.report()["policy"] is None:
            step(done)
            done += 1
        for i in range(done, max(done, args.warmup)):
            step(i)
        return done

    class Stepper:
        """Step ``i`` of a model's loop, under ``ov.step()`` while it has an overlap (None: plain)."""

        def __init__(self, model, opt, ov):
            self.model, self.opt, self.ov = model, opt, ov

        def __call__(self, i: int) -> None:
            with self.ov.step() if self.ov is not None else contextlib.nullcontext():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = nn.functional.cross_entropy(self.model(x).reshape(y.numel(), -1), y)
                loss.backward()
                self.opt.step()
                self.opt.zero_grad(set_to_none=False)
            if (i + 1) % 10 == 0:
                loss.item()

    def timed(step: Stepper, steps: int) -> float:
        """ms per step of ``steps`` steps, the GPU's work included (this rank's)."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3 / steps

    def slowest(values: list[float]) -> list[float]:
        t = torch.tensor(values, device=device, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def kept_of(ov) -> dict:
        report = ov.report()
        trials = report["trials"] or {}  # a fixed policy has none
        return dict(kept=report["policy"], check=trials.get("check"), means=trials.get("means_ms"),
                    nccl_memory=report["nccl_memory"])

    def in_turn(name: str, before: str | None = None) -> dict:
        """``name`` against plain (``--against kept``: against the policy auto kept, fixed) in blocks of
        --alternate steps, beside, policy, policy, beside per round ("plain" in the reading);
        ``before``: the measured model runs that policy first (:func:`fresh`)."""
        if args.against == "plain":
            beside_step, step = Stepper(*fresh(None)), Stepper(*fresh(name, before))
            warm(beside_step)
            done = warm(step)
            beside = plain
        else:  # the fixed model is made once auto has decided: it runs what auto kept
            step = Stepper(*fresh(name, before))
            done = warm(step)
            kept = step.ov.report()["policy"]
            beside_step = Stepper(*fresh(kept))
            warm(beside_step)
            beside = f"fixed {kept}"
        runs = {"plain": beside_step, "way": step}
        blocks = run_rounds(lambda which: timed(runs[which], args.alternate), args.rounds)
        way = name if before is None else f"{name} after {args.before_steps} steps of {before}"
        out = {"way": f"{way} in turn with {beside}", "block": args.alternate, "rounds": args.rounds,
               "trial_steps": done, **blocks_reading(blocks, slowest), **kept_of(step.ov)}
        for ov in (step.ov, beside_step.ov):
            if ov is not None:
                ov.close()
        runs.clear()
        del beside_step, step  # both models and their optimizers, before the next policy's pair
        gc.collect()
        torch.cuda.empty_cache()
        if rank == 0:
            print(json.dumps(out), flush=True)
            print(f"{way} in turn with {beside} ({args.rounds} rounds of blocks of {args.alternate} steps): {beside} "
                  f"{out['plain_ms']:.2f} ms (+-{out['plain_standard_error_ms']:.2f}), {name} {out['way_ms']:.2f} "
                  f"(+-{out['way_standard_error_ms']:.2f}, kept {out['kept']}): {out['ratio']:.3f}x "
                  f"(+-{out['ratio_standard_error']:.3f}, by rounds)", flush=True)
        return out

    def phase(name: str, policy: str | None) -> dict:
        model, opt, ov = fresh(policy)
        step = Stepper(model, opt, ov)
        done = warm(step)
        # two windows of --steps: a slow first one is a transient after the warm-up (or auto's decision)
        windows, seen = [], []

        def window() -> None:
            before = snapshot(model) if args.diagnose else None
            windows.append(timed(step, args.steps))
            if before is not None:
                seen.append(change(before, snapshot(model)))

        for _ in range(2):
            window()
        report = kept_of(ov) if ov is not None else None
        if ov is not None:
            ov.close()
            if args.diagnose:  # the same model, plain again: does what made the phase slow outlive close()?
                step.ov = None
                window()
        ms = slowest(windows)
        out = {"way": name, "ms": ms[0], "ms_later": ms[1], "trial_steps": done}
        if len(ms) > 2:
            out["ms_closed"] = ms[2]
        if seen:
            out["diagnose"] = seen
        if report is not None:
            out.update(report)
        if rank == 0:
            print(json.dumps(out), flush=True)
        return out

    if args.alternate:
        runs = [in_turn(name, before) for name in policies for before in befores]
        if rank == 0 and args.json:
            with open(args.json, "w") as f:
                json.dump(runs, f)
        dist.destroy_process_group()
        return
    runs = [phase(plain, None), *(phase(name, name) for name in policies), phase(f"{plain} again", None)]
    if rank == 0:
        for key, which in (("ms", "the first window"), ("ms_later", "the second window")):
            base = (runs[0][key] + runs[-1][key]) / 2
            ways = ", ".join(f"{run['way']} {run[key]:.2f} ms ({run[key] / base:.3f}x their mean, kept {run['kept']})"
                             for run in runs[1:-1])
            print(f"{which}: {plain} {runs[0][key]:.2f} / {runs[-1][key]:.2f} ms; {ways}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(runs, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
