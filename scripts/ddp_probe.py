"""Where a DDP step's host time goes, hook by hook (a diagnostic, not a test).

One process per rank (torchrun or python -m shimrt.launch), or alone (world size 1). A decoder
of torch's own nn.TransformerEncoderLayer (a user's model, not bench torch's), fp32 parameters
under bf16 autocast, fused AdamW, the loss read every 10 steps. Each way trains ``--steps``
steps after ``--warmup`` and is timed as a whole (synchronize before and after), slowest rank:

- plain DDP (no hook), torch's built-in C++ all-reduce hook, torch's Python ``allreduce_hook``,
  a minimal Python hook (ProcessGroup.allreduce, AVG), a CUDA future and nothing else (world
  size 1 only: the all-reduce of one rank is the identity), and shimrt.torch.overlap's policies;
- per-call host costs of what a hook does (10000 calls each);
- with ``--profile DIR``: a torch.profiler trace of one step of some ways (chrome JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Decoder(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, vocab: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                               batch_first=True, norm_first=True)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = self.embed(tokens) + self.pos.weight[: tokens.shape[1]]
            for b in self.blocks:
                x = b(x, src_mask=self.mask, is_causal=True)
            logits = self.head(self.ln(x))
        return nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--bucket-mb", type=float, default=None)
    p.add_argument("--ways", default="plain,builtin,python,minimal,future,priority,carveout:32,plain")
    p.add_argument("--profile", default=None)
    p.add_argument("--micro", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--rounds", type=int, default=0,
                   help="instead: every way built at once, visited in turn (a warm-up step, then --visit steps "
                        "timed as a whole), for this many rounds; mean and spread per way against plain")
    p.add_argument("--visit", type=int, default=3)
    args = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev_index = int(os.environ.get("SHIMRT_DEVICES", str(local)).split(",")[local]) if "SHIMRT_DEVICES" in os.environ \
        else local
    device = torch.device("cuda", dev_index)
    torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=120))
    rank, size = dist.get_rank(), dist.get_world_size()
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    results: dict = {"args": vars(args), "world": size, "torch": torch.__version__, "ways": {}}

    def fresh():
        torch.manual_seed(0)
        m = Decoder(args.width, args.layers, args.width // 64, 32768, args.seq).to(device)
        kw = {} if args.bucket_mb is None else {"bucket_cap_mb": args.bucket_mb}
        ddp = DDP(m, device_ids=[dev_index], **kw)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=True)
        return ddp, opt

    g = torch.Generator().manual_seed(1 + rank)
    batch = args.tokens // args.seq
    data = [torch.randint(0, 32768, (batch, args.seq + 1), generator=g) for _ in range(4)]
    data = [(d[:, :-1].contiguous().to(device), d[:, 1:].contiguous().to(device)) for d in data]
    hook_ns: list[int] = []

    def timed_hook(inner):
        def hook(state, bucket):
            t0 = time.perf_counter_ns()
            out = inner(state, bucket)
            hook_ns.append(time.perf_counter_ns() - t0)
            return out
        return hook

    def first(fut):
        return fut.value()[0]

    def minimal(state, bucket):
        return state.pg.allreduce([bucket.buffer()], state.opts).get_future().then(first)

    def future_only(state, bucket):
        f = torch.futures.Future(devices=[device])
        f.set_result(bucket.buffer())
        return f

    if args.micro and rank == 0 and args.rounds:
        results["micro_us"] = micro(device)
        say(json.dumps(results["micro_us"], indent=1))
    if args.rounds:
        results["rounds"] = rounds(args, fresh, data, device, say)
        if args.json and rank == 0:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        dist.destroy_process_group()
        return
    import warnings
    for way in args.ways.split(","):
        warnings.resetwarnings()
        warnings.simplefilter("always")
        caught = warnings.catch_warnings(record=True)
        seen = caught.__enter__()
        ddp, opt = fresh()
        ov = None
        hook_ns.clear()
        if way == "builtin":
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        elif way == "python":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            ddp.register_comm_hook(None, timed_hook(allreduce_hook))
        elif way == "minimal":
            pg = ddp.process_group if ddp.process_group is not None else dist.group.WORLD
            pg = dist.distributed_c10d._get_default_group() if pg is None else pg
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.AVG
            ddp.register_comm_hook(_State(pg, opts), timed_hook(minimal))
        elif way == "future":
            if size != 1:
                continue
            ddp.register_comm_hook(None, timed_hook(future_only))
        elif way != "plain":
            import shimrt.torch
            ov = shimrt.torch.overlap(ddp, policy=way, timeout=120)
        step_ctx = ov.step if ov is not None else None
        buckets = [0]

        def step(i, ddp=ddp, opt=opt, step_ctx=step_ctx):
            x, y = data[i % len(data)]
            return _train(i, ddp, opt, step_ctx() if step_ctx is not None else contextlib.nullcontext(), x, y)

        trial = 0
        while ov is not None and ov.report()["policy"] is None:  # auto's trials, apart
            step(trial)
            trial += 1
        for i in range(args.warmup):
            step(i)
        torch.cuda.synchronize()
        hook_ns.clear()
        t0 = time.perf_counter()
        for i in range(args.steps):
            step(i)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / args.steps
        t = torch.tensor([ms], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms = t.item()
        buckets = len(hook_ns) / args.steps if hook_ns else None
        entry = {"step_ms": ms, "buckets_per_step": buckets,
                 "hook_us_median": statistics.median(hook_ns) / 1e3 if hook_ns else None,
                 "hook_us_per_step": sum(hook_ns) / 1e3 / args.steps if hook_ns else None}
        if ov is not None:
            entry["report"] = ov.report()
            entry["trial_steps"] = trial
        key = way
        n = 2
        while key in results["ways"]:
            key, n = f"{way}#{n}", n + 1
        caught.__exit__(None, None, None)
        entry["warnings"] = sorted({str(w.message)[:90] for w in seen})
        results["ways"][key] = entry
        for w in entry["warnings"]:
            say(f"    warning: {w}")
        say(f"{key:16s} {ms:8.2f} ms/step  buckets/step {buckets}  hook us median "
            f"{entry['hook_us_median']}  per step {entry['hook_us_per_step']}")
        if ov is not None:
            rep = entry["report"]
            say(f"    kept {rep['policy']} ({rep['process_group']}) after {trial} trial steps; reference "
                f"{rep['reference']}; host us {rep['host_us'].get(rep['policy'])}")
        if args.profile and way in ("plain", "priority", "python", "carveout:32") and f"{way}.json" not in os.listdir(
                args.profile):
            from torch.profiler import ProfilerActivity, profile
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step(0)
                torch.cuda.synchronize()
            if rank == 0:
                prof.export_chrome_trace(os.path.join(args.profile, f"{way.replace(':', '_')}.json"))
                say(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        if ov is not None:
            ov.close()
        del ddp, opt, ov
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    if args.micro and rank == 0:
        results["micro_us"] = micro(device)
        say(json.dumps(results["micro_us"], indent=1))
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


def rounds(args, fresh, data, device, say) -> dict:
    """Every way of --ways at once (a model, DDP and optimizer each), visited in turn per round:
    what a two-speed GPU does to one way's run, it does to every way's alike. ``pg-high`` and
    ``pg-ctasN``: no hook, DDP on a process group of high-priority streams (and NCCL held to N
    CTAs, ProcessGroupNCCL.Options.config), the way a policy could run at DDP's own host cost;
    ``WAY+carveout:N`` (WAY plain or pg-...): cuBLAS leaves N SMs free during the step, no hook."""
    import shimrt.torch
    built = {}
    from shimrt.torch.interop import sm_carveout
    carve: dict = {}
    for way in dict.fromkeys(args.ways.split(",")):
        base, _, extra = way.partition("+")  # "+carveout:N": cuBLAS leaves N SMs free, no hook
        if extra:
            if not extra.startswith("carveout:") or base == "minimal" or base == "builtin":
                raise SystemExit(f"--ways: {way!r}: only plain or pg-... take +carveout:N")
            carve[way] = int(extra[len("carveout:"):])
        if base.startswith("pg-"):
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = True
            if base.startswith("pg-ctas"):
                opts.config.min_ctas = opts.config.max_ctas = int(base[len("pg-ctas"):])
            pg = dist.new_group(list(range(dist.get_world_size())), backend="nccl", pg_options=opts)
            torch.manual_seed(0)
            m = Decoder(args.width, args.layers, args.width // 64, 32768, args.seq).to(device)
            ddp = DDP(m, device_ids=[device.index], process_group=pg,
                      **({} if args.bucket_mb is None else {"bucket_cap_mb": args.bucket_mb}))
            built[way] = (ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=True), None)
            continue
        if extra:
            built[way] = (*fresh(), None)
            continue
        ddp, opt = fresh()
        ov = None
        if way == "minimal":
            pg = dist.distributed_c10d._get_default_group()
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.AVG
            ddp.register_comm_hook(_State(pg, opts), lambda st, b: st.pg.allreduce([b.buffer()], st.opts)
                                   .get_future().then(lambda f: f.value()[0]))
        elif way == "builtin":
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        elif way != "plain":
            ov = shimrt.torch.overlap(ddp, policy=way, timeout=120)
        built[way] = (ddp, opt, ov)
    times: dict = {w: [] for w in built}

    def step(i, way, ddp, opt, ov):
        x, y = data[i % len(data)]
        context = ov.step() if ov is not None else sm_carveout(carve[way]) if way in carve \
            else contextlib.nullcontext()
        _train(i, ddp, opt, context, x, y)
    i = 0
    for _ in range(args.rounds):
        for way, (ddp, opt, ov) in built.items():
            step(i, way, ddp, opt, ov)  # the warm-up: a switch of model's first step
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.visit):
                i += 1
                step(i, way, ddp, opt, ov)
            torch.cuda.synchronize()
            t = torch.tensor([(time.perf_counter() - t0) * 1e3 / args.visit], device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[way].append(t.item())
    out = {}
    base = statistics.fmean(times["plain"]) if "plain" in times else None
    for way, ts in times.items():
        mean, sd = statistics.fmean(ts), statistics.stdev(ts) if len(ts) > 1 else 0.0
        ov = built[way][2]
        host = ov.report()["host_us"].get(way) if ov is not None else None
        out[way] = {"mean_ms": mean, "stdev_ms": sd, "visits_ms": ts, "host_us": host}
        say(f"{way:16s} mean {mean:7.2f} ms  sd {sd:5.2f}  "
            f"{'' if base is None else f'{mean / base:.3f}x plain'}  host {host}")
    return out


def _train(i, ddp, opt, context, x, y):
    """One training step inside ``context``; the loss read on the host every 10th step."""
    with context:
        loss = ddp(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    if i % 10 == 9:
        loss.item()
    return loss


def micro(device) -> dict:
    """Host microseconds per call of what a hook does."""
    from torch._jit_internal import _extract_tensors
    n = 5000
    buf = torch.zeros(1 << 20, device=device)
    ts = torch.cuda.Stream(device=device, priority=-1)
    cur = torch.cuda.current_stream(device)
    out = {}

    def bench(name, fn):
        for _ in range(200):
            fn()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter_ns() - t0) / n / 1e3
        torch.cuda.synchronize()

    bench("current_stream", lambda: torch.cuda.current_stream(device))
    bench("wait_stream", lambda: ts.wait_stream(cur))
    ev = torch.cuda.Event()
    bench("event_record+wait", lambda: (ev.record(cur), ts.wait_event(ev)))
    bench("Future(devices)", lambda: torch.futures.Future(devices=[device]))

    def ctx_set():
        f = torch.futures.Future(devices=[device])
        with torch.cuda.stream(ts):
            f.set_result(buf)
    bench("Future+stream ctx+set_result", ctx_set)

    def setstream_set():
        f = torch.futures.Future(devices=[device])
        torch.cuda.set_stream(ts)
        f.set_result(buf)
        torch.cuda.set_stream(cur)
    bench("Future+set_stream+set_result", setstream_set)
    bench("stream ctx alone", lambda: torch.cuda.stream(ts).__enter__() or torch.cuda.set_stream(cur))
    bench("_extract_tensors", lambda: _extract_tensors(buf))

    def cpu_future():
        f = torch.futures.Future()
        f.set_result(buf)
    bench("cpu Future+set_result", cpu_future)
    bench("then(first)", lambda: _done_future(buf).then(lambda f: f.value()))
    try:
        import shimrt
        from shimrt.nccl import Communicator, unique_id
        d = shimrt.Device(device.index)
        comm = Communicator(d, unique_id(), 0, 1)
        s = d.stream("high")
        bench("shimrt all_reduce avg (one-off)", lambda: comm.all_reduce(buf, op="avg", stream=s))
        call = comm.prepare("all_reduce", buf, op="avg", stream=s)
        bench("shimrt prepared all_reduce", call)
        pg = dist.distributed_c10d._get_default_group()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        bench("ProcessGroupNCCL allreduce (hookless DDP's call)", lambda: pg.allreduce([buf], opts))
        bench("pg.allreduce + get_future().then", lambda: pg.allreduce([buf], opts).get_future().then(
            lambda f: f.value()[0]))
        s.synchronize()
        comm.close()
        s.close()
    except Exception as exc:  # a diagnostic: say and go on
        out["shimrt_error"] = repr(exc)
    return out


class _State:
    def __init__(self, pg, opts):
        self.pg, self.opts = pg, opts


def _done_future(value):
    f = torch.futures.Future()
    f.set_result(value)
    return f


if __name__ == "__main__":
    main()
