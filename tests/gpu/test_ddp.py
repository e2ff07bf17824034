"""shimrt.torch.overlap in a real DDP job: examples/ddp_overlap.py under shimrt.launch, two
processes (two GPUs, or both on this one where NCCL allows it; under MPS where it can be had),
its parameters after the steps set against a plain DDP copy trained on the same data; and bench
torch --in-turn with one process per rank, under DDP and FSDP2, on a small model."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shimrt import CollectiveError
from shimrt.bench.torch_ddp_report import ONE_BUCKET_WAY
from shimrt.launch import mps
from shimrt.nccl import library
from shimrt.nccl.config import check_shared_gpu
from shimrt.torch.policies import Auto

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_overlap.py"


def _two_ranks(device) -> tuple:
    """(the NCCL shimrt loads, the GPU index of each of two ranks): two GPUs where there are two,
    else both on this one; skipped with the reason where torch, CUDA or such an NCCL is missing."""
    torch = pytest.importorskip("torch")
    if device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA on a CUDA device")
    try:
        lib = library.load(device.backend)
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    if device.device_count() >= 2:
        return lib, ["0", "1"]
    try:
        check_shared_gpu(lib, device.backend, "two ranks on this machine's one GPU")
    except CollectiveError as exc:
        pytest.skip(str(exc))
    return lib, ["0", "0"]


def _launch(device, *args, timeout=280, refused=False, target=None, stderr=False):
    """The example (or ``target``, the launcher's arguments for another program) on two ranks
    (two GPUs, else both on GPU 0 under MPS); its output, each rank's standard output and error
    (with ``stderr``, the launcher's own standard error after it). A policy that cannot run here is
    skipped with the reason, or with ``refused`` its output returned."""
    lib, indices = _two_ranks(device)
    flags = ["--devices", ",".join(indices)]
    if indices == ["0", "0"]:
        try:  # side by side under MPS where it can be had; else they time-slice (slower, as correct)
            if not mps.running(mps.find_control()):
                flags.append("--mps")
        except mps.MpsError:
            pass
    env = _env(lib, MASTER_ADDR="localhost", MASTER_PORT=str(_free_port()))
    command = [sys.executable, "-m", "shimrt.launch", "--nproc", "2", *flags, "--timeout", str(timeout - 20),
               *(target or [str(EXAMPLE)]), *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if run.returncode != 0 and "cannot run here" in run.stdout + run.stderr:  # no green contexts (under MPS, say)
        if refused:
            return run.stdout + run.stderr
        pytest.skip("; ".join(set(re.findall(r"cannot run here: [^\n]*", run.stdout + run.stderr))))
    assert run.returncode == 0, _failure(run.stdout + run.stderr)
    return run.stdout + run.stderr if stderr else run.stdout


def _failure(text: str) -> str:
    """The lines that say what went wrong (a crash's first lines scroll far above its frames), then the end."""
    said = [line for line in text.splitlines()
            if re.search(r"Error|error:|terminate|Traceback|what\(\)|killed|abort", line) and "frame #" not in line]
    return "\n".join(said[:40]) + "\n...\n" + text[-3000:]


def _free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port the kernel hands out (bind to
    port 0) can be taken by another process's outgoing connection, NCCL's among them, before the
    rank's store listens on it (EADDRINUSE, seen on the H100)."""
    import random
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("localhost", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _env(lib, **more) -> dict:
    """The ranks' environment: this checkout, no launch of the test's own, and torch calling the
    NCCL shimrt loads (preloaded: two ranks on one GPU need 2.30+, and one NCCL serves both)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE",
                 "SHIMRT_NCCL_UNIQUE_ID", "SHIMRT_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    env.update(more)  # after the clearing: a test may set WORLD_SIZE itself
    env["LD_PRELOAD"] = " ".join(x for x in (lib.path, os.environ.get("LD_PRELOAD", "")) if x)
    return env


def _diff(out: str) -> tuple[float, str]:
    m = re.search(r"max \|overlap - plain (?:DDP|FSDP2)\| = (\S+) \((bit for bit|not bit for bit)\)", out)
    assert m, out[-3000:]
    return float(m.group(1)), m.group(2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("policy, group", [("priority", "ProcessGroupNCCL, high-priority streams"),
                                           ("sequential", "the model's own, its gradients all-reduced after backward")])
def test_priority_and_sequential_give_plain_ddps_parameters_bit_for_bit(device, dtype, policy, group):
    """DDP's own reducer on a group of high-priority streams, or every gradient all-reduced once
    after backward on the DDP's own group: the same kernels, the same reduction (two ranks: a/2 +
    b/2 either way), bit for bit."""
    out = _launch(device, "--policy", policy, "--compare", "--steps", "12", "--width", "512", "--layers", "2",
                  "--tokens", "256", "--dtype", dtype)
    assert _diff(out) == (0.0, "bit for bit"), out[-2000:]
    assert f"policy: {policy} (" in out and f"process group: {group}" in out, out[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["shaping:2", "carveout:32", "windowed-carveout:32", "partition:32"])
def test_every_compute_policy_trains_as_plain_ddp_within_a_different_kernels_rounding(device, policy):
    """A policy that changes torch's kernels (a carveout changes cuBLAS's choice) may round
    differently: within 1e-5 of plain DDP's fp32 parameters after 12 steps. And torch says nothing
    a user could not act on: no warning that a policy group's options carry another timeout than
    the group, nor (partition:32, whose backward runs on the partition's stream beside DDP's
    gradient accumulators) that DDP should be made on the forwards' stream."""
    out = _launch(device, "--policy", policy, "--compare", "--steps", "12", "--width", "512", "--layers", "2",
                  "--tokens", "256", "--dtype", "fp32", stderr=True)
    diff, _ = _diff(out)
    assert diff <= 1e-5, out[-2000:]
    assert f"policy: {policy}" in out
    for warned in ("backend_options._timeout was specified", "AccumulateGrad node's stream does not match"):
        assert warned not in out, _failure(out)


# auto's log lists means as 'name[*] ms, ...' (* a finalist; inf a way that never ran)
MEANS = r"([^\s,*]+)(\*?) ([0-9.]+|inf)(?:,|$)"


@pytest.mark.timeout(360)
def test_auto_confirms_its_finalists_beside_ddp_and_keeps_one_no_slower_in_its_trials(device):
    # 700 steps: auto decides in 603 at the most (16 candidates in visits of 3 timed steps, none dropped after
    # the first round, its check in blocks run to 24 rounds, both guards)
    out = _launch(device, "--policy", "auto", "--steps", "700", "--width", "1024", "--layers", "2", "--tokens", "512")
    m = re.search(r"auto kept (\S+) .* mean step ms \(\* finalists; ddp: plain DDP\): (.+)$", out, re.M)
    assert m, out[-3000:]
    means = {n: (float(t), star == "*") for n, star, t in re.findall(MEANS, m.group(2))}
    kept, ddp = means[m.group(1)], means["ddp"]
    assert kept[1] and ddp[1], out[-2000:]  # both finalists
    # The kept no slower: in its block check beside plain DDP where that check held (auto checks its pick
    # even when the trials put plain DDP first, and a held check overrules the trials), else in the trials;
    # a tie the trials broke at most Auto()'s margin above plain DDP in the check.
    c = re.search(r"auto's check of (\S+) alone beside plain DDP, mean step ms: (.+) "
                  r"\((held(?: by its bound| by its steadiness| as a tie the trials broke| alone)?"
                  r"|plain DDP kept|gave way alone)\)$",
                  out, re.M)
    if c and c.group(3) == "held alone":  # the check gave way; alone, the pick beat plain DDP alone
        a = re.search(r"plain DDP alone after it, \d+ steps ([0-9.]+) ms .*; \S+ alone then, \d+ steps ([0-9.]+) ms",
                      out)
        assert a and float(a.group(2)) < float(a.group(1)) * (1 - Auto().margin), out[-2000:]
    elif c and c.group(3).startswith("held"):
        checked = {n: float(t) for n, _, t in re.findall(MEANS, c.group(2))}
        allowed = 1 + Auto().margin if c.group(3).endswith("broke") else 1.0
        assert c.group(1) == m.group(1) and checked[m.group(1)] <= checked["ddp"] * allowed, out[-2000:]
    else:
        assert kept[0] <= ddp[0], out[-2000:]
    assert f"policy: {m.group(1)} (" in out, out[-2000:]  # the steps after the trials ran under it
    # rank 0's progress, a line as each stage begins: the search from the first step, its rounds after the
    # first, then the check
    assert re.search(r"auto, from trial step 0: \d+ candidates, the first of 3 rounds of 3 timed steps each, after "
                     r"\d+ steps? of ddp \(then those more than 30% slower than ddp and the median drop out\): "
                     r"\d+ steps", out), \
        out[-3000:]
    assert re.search(r"auto, from trial step \d+: \d+ candidates left \((dropped: [^)]+|none dropped)\), rounds "
                     r"2-3 of 3 timed steps each: \d+ steps", out), out[-3000:]
    assert re.search(r"auto, from trial step \d+: \S+ checked beside ddp in blocks of 6 steps, rounds 1-4 of at "
                     r"most \d+: \d+ steps", out), out[-3000:]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_rank_that_leaves_ends_the_other_within_the_timeout_as_plain_ddp_does(device, kind):
    """Rank 1 exits mid-training under ``priority``: rank 0's all-reduce on shimrt's group never
    completes, and torch's NCCL watchdog ends rank 0 after the group's timeout (8 s), saying so, as
    it ends a plain DDP rank; nothing waits for the default group's 120 s. After the timeout torch
    waits TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC for its debug dump before it ends the process (60 s
    by default in torch 2.11, seen on the H200: rank 0 lived 68 s); the ranks here set it to 1 s."""
    lib, indices = _two_ranks(device)
    timeout = 8
    env = _env(lib, MASTER_ADDR="localhost", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC="1000")
    script = str(Path(__file__).with_name("ddp_peer_exits.py"))
    extra = ["fsdp"] if kind == "fsdp" else []
    procs = [subprocess.Popen([sys.executable, script, indices[r], "5", str(timeout), *extra], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in (0, 1)]
    try:
        out0, _ = procs[0].communicate(timeout=150)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert "rank 0: the peer left" in out0 and procs[0].returncode != 0, out0[-3000:]
    alive = [int(n) for n in re.findall(r"rank 0: alive ([0-9]+) s after the peer left", out0)]
    assert max(alive, default=0) <= timeout + 10, out0[-3000:]
    assert re.search(r"[Tt]imed? ?out|[Ww]atchdog", out0), out0[-3000:]


@pytest.mark.timeout(200)
def test_a_ddp_over_a_sub_group_of_a_device_bound_world_is_refused_at_once_not_hung(device):
    """A policy's group over some ranks would split the world's communicator, which the ranks
    outside the DDP never join: overlap() refuses it with the reason on the DDP's rank, before
    any collective; ``ddp`` makes no group and runs; both ranks end."""
    lib, indices = _two_ranks(device)
    env = _env(lib, MASTER_ADDR="localhost", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    script = str(Path(__file__).with_name("ddp_subgroup.py"))
    procs = [subprocess.Popen([sys.executable, script, indices[r]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert "rank 0: refused:" in outs[0] and "sub-group of the world" in outs[0], _failure(outs[0])
    assert "rank 0: ddp ran" in outs[0] and "rank 0: done" in outs[0], _failure(outs[0])
    assert "rank 1: done" in outs[1] and all(p.returncode == 0 for p in procs), _failure(outs[1])


def _one_rank(device, policy: str, margin: float, steps: int, *more: str) -> dict:
    """tests/gpu/ddp_one_rank.py in a process of its own: one rank over NCCL (any NCCL will do)."""
    torch = pytest.importorskip("torch")
    if device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA on a CUDA device")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_DEVICES"):
        env.pop(name, None)
    script = str(Path(__file__).with_name("ddp_one_rank.py"))
    run = subprocess.run([sys.executable, script, policy, str(margin), str(steps), *more], capture_output=True,
                         text=True, timeout=240, env=env)
    assert run.returncode == 0, _failure(run.stdout + run.stderr)
    import json
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_plain_ddp_kept_by_auto_or_asked_for_leaves_the_ddp_on_its_own_group(device):
    """auto (margin 0.5: nothing on one rank is half plain DDP's time) keeps plain DDP: the trials
    moved the DDP over its candidates' groups and back to its own, no hook was ever registered,
    the reference was timed, and the parameters are plain DDP's within the rounding of the trials'
    other kernels; ``ddp`` asked for is plain DDP from the first step, bit for bit."""
    got = _one_rank(device, "auto", 0.5, 60)
    assert got["policy"] == "ddp" and got["own_group"] and got["groups_seen"] >= 3 and got["hooks"] == 0, got
    assert got["reference"]["mean_ms"] > 0 and got["diff"] <= 1e-5, got
    # nothing of the trials is left: no group, Interposer or window hook; torch's knobs as they were
    # (the partitions stay, by design: torch's allocator records events on their streams)
    left = got["left"]
    assert left["nccl_groups"] == 0 and left["interposers_caps"] == [] and not left["window_hook"], got
    assert left["carveout"] is None and left["blas_restored"], got
    assert got["nccl_memory"]["alive_mib"] == 0 and len(got["nccl_memory"]["made_mib"]) >= 2, got
    check = got["trials"]["check"]  # Auto(check_always=True): the fastest other finalist checked, and gave way
    assert check is not None and check["held"] is False and check["policy"] != "ddp", got
    fixed = _one_rank(device, "ddp", 0.01, 12)
    assert fixed["policy"] == "ddp" and fixed["own_group"] and fixed["groups_seen"] == 1, fixed
    assert fixed["hooks"] == 0 and fixed["diff"] == 0.0, fixed
    # nor the allocator's blocks of the trials (a partition's stream has a pool of its own, and a
    # cuBLAS workspace): 12 steps after auto kept it, plain DDP reserves no more than plain DDP asked
    # for does, within one of the allocator's large segments (20 MiB)
    assert left["reserved_mib"] <= fixed["left"]["reserved_mib"] + 20, (left, fixed["left"])


@pytest.mark.timeout(300)
def test_paced_is_plain_ddp_with_the_gpu_done_at_each_steps_end(device):
    """paced: plain DDP on its own group, no hook, bit for bit, and the host back from each
    ov.step() only once the GPU has run the step (its stream idle)."""
    got = _one_rank(device, "paced", 0.01, 12)
    assert got["policy"] == "paced" and got["own_group"] and got["groups_seen"] == 1 and got["hooks"] == 0, got
    assert got["diff"] == 0.0 and got["idle_after_steps"], got
    assert got["host_us"]["paced"]["steps"] == 12, got


@pytest.mark.timeout(300)
def test_a_second_overlap_in_the_process_while_a_group_is_kept_and_after_close_makes_its_own_groups(device):
    """torch 2.11 named a group over some ranks by the count of groups alive, so a group made
    after others were destroyed could take a live group's name (ValueError). Over the whole world
    the groups are named by torch's count, which never repeats: A keeps priority's group, B makes
    carveout:32's, A is closed, and auto C runs its trials while B's group lives; auto D after
    every one is closed."""
    got = _one_rank(device, "priority", 0.01, 6, "second")
    assert got["policy"] == "priority" and got["seconds"] and len(got["seconds"]) == 2, got
    assert all(p is not None for p in got["seconds"]), got
    assert got["nccl_memory"]["alive"] == 1, got  # the first's group, measured where it was made


@pytest.mark.timeout(300)
def test_a_ddp_with_mixed_precision_moves_to_the_policys_group_and_trains_as_plain(device):
    """DDP's mixed_precision registers a comm hook of its own, which all-reduces through the
    reducer's process group: overlap() takes it, the DDP trains on priority's group, and one
    rank's average is the identity either way: bit for bit against a plain mixed-precision DDP."""
    got = _one_rank(device, "priority", 0.01, 12, "mixed")
    assert got["policy"] == "priority" and not got["own_group"] and got["high_priority"], got
    assert got["hooks"] == 1 and got["own_group_after_close"] and got["diff"] == 0.0, got


@pytest.mark.timeout(300)
def test_priority_puts_the_ddp_on_a_high_priority_group_until_closed_and_reports_its_host_cost(device):
    """priority: the DDP on a ProcessGroupNCCL of high-priority streams from the first step, no
    hook, ov.step()'s host time per step counted; back on its own group once closed. One rank's
    average is the identity either way: bit for bit."""
    got = _one_rank(device, "priority", 0.01, 12)
    assert got["policy"] == "priority" and not got["own_group"] and got["high_priority"], got
    assert got["groups_seen"] == 1 and got["own_group_after_close"] and got["hooks"] == 0 and got["diff"] == 0.0, got
    host = got["host_us"]["priority"]
    assert host["steps"] == 12 and 0 < host["step_us"] < 5_000, got


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy, route", [("priority", "mesh"), ("carveout:32", "mesh"), ("priority", "custom"),
                                           ("prefetch:2", "mesh"), ("ctas:8", "custom"), ("no-reshard", "mesh"),
                                           ("zero-sm", "custom")])
def test_fsdp2_under_a_policy_trains_as_plain_fsdp2_with_two_ranks(device, policy, route):
    """The example with --fsdp: every layer fully_shard-ed, the policy's group and streams under
    FSDP2 (through its groups' mesh, or its public custom collectives); against plain FSDP2, shard
    by shard: bit for bit where only the group, streams, prefetch, resharding, NCCL's channels or its CTA
    policy and the all-gathers' memory change (two ranks: a + b either way; an all-gather copies),
    within 1e-5 where cuBLAS's carveout changes kernels. zero-sm is skipped, with the reason, where
    this torch cannot ask for it, and refused with the reason where the two ranks share a GPU (NCCL
    2.32.3's symmetric memory failed there with invalid usage: shimrt.torch.fsdp)."""
    if policy == "zero-sm":
        import torch.distributed as dist

        from shimrt import UsageError
        from shimrt.torch.fsdp import symmetric_refusal
        from shimrt.torch.groups import options
        try:
            options(dist, "high", None, zero_sm=True)
        except UsageError as exc:
            pytest.skip(str(exc))
        if why := symmetric_refusal():
            pytest.skip(why)
        if device.device_count() < 2:
            out = _launch(device, "--fsdp", "--fsdp-route", route, "--policy", policy, "--steps", "4", "--width", "512",
                          "--layers", "2", "--tokens", "256", refused=True)
            assert "cannot run here" in out and "zero-sm needs NCCL's symmetric memory" in out, _failure(out)
            assert "2 ranks on one GPU" in out and "Traceback" not in out, _failure(out)
            return
    out = _launch(device, "--fsdp", "--fsdp-route", route, "--policy", policy, "--compare", "--steps", "12",
                  "--width", "512", "--layers", "2", "--tokens", "256", "--dtype", "fp32")
    diff, said = _diff(out)
    assert (diff, said) == (0.0, "bit for bit") if policy != "carveout:32" else diff <= 1e-5, out[-2000:]
    assert f"policy: {policy} (" in out, out[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_bench_torch_in_turn_times_every_way_in_blocks_beside_a_plain_job_and_reads_it(device, tmp_path, fsdp):
    """bench torch --in-turn with one process per rank, on a small model: each way (plain, priority,
    plain again; under DDP plain DDP in one bucket too) is timed in 2 rounds of 2-step blocks beside
    a plain job of its own; every way has its 8 timed steps, a ratio per round, losses that follow
    plain's, and the table says the noise in turn."""
    import json
    out = tmp_path / "in_turn.json"
    one = ONE_BUCKET_WAY
    text = _launch(device, "torch", *(["--fsdp"] if fsdp else ["--one-bucket"]), "--configs", "balanced",
                   "--width", "256", "--layers", "2", "--seq", "128", "--policies", "priority", "--in-turn", "2",
                   "--rounds", "2", "--steps", "2", "--sms", "32", "--optimizer", "adamw", "--timeout", "220",
                   "--json", str(out), timeout=280, target=["-m", "shimrt.bench"])
    ways = json.loads(out.read_text())["configs"]["balanced"]["ways"]
    assert list(ways) == ["plain DDP", *([] if fsdp else [one]), "priority", "plain DDP again"], text[-2000:]
    for name, e in ways.items():
        assert "failed" not in e, (name, e)
        assert len(e["steps_ms"]) == 8 and all(0 < t < 10_000 for t in e["steps_ms"]), (name, e)
        turn = e["in_turn"]
        assert (turn["block"], turn["rounds"], len(turn["ratios"])) == (2, 2, 2), (name, turn)
        assert 0 < turn["ratio"] < 100 and turn["plain_ms"] > 0 and turn["way_ms"] > 0, (name, turn)
        # one untimed step before each of the way's 4 blocks, no --warmup in this mode
        assert e["untimed_steps"] == 4, (name, e)
        # the caching allocator over the timed steps: what the ranks reserve, and the GPU's free memory
        memory = e["allocator"]
        assert memory["retries"] >= 0 and memory["reserved_gib"] > 0 and memory["device_free_gib"] > 0, (name, e)
    # each way's model against the plain one beside it: plain DDP's is as plain's; priority's moved
    # group (DDP) or streams and groups (FSDP2), while it ran
    assert ways["plain DDP"]["unlike_plain"] == [] and ways["plain DDP again"]["unlike_plain"] == [], ways
    assert set(ways["priority"]["unlike_plain"]) == ({"groups", "streams"} if fsdp else {"group"}), ways["priority"]
    # the same weights and batches as plain's, step for step: within a different kernel's rounding
    assert ways["priority"]["loss_max_diff"] < 1e-2 and ways["plain DDP again"]["loss_max_diff"] < 1e-2, ways
    if not fsdp:  # plain DDP whose gradients DDP's reducer put in one bucket, plain DDP's as DDP(model) does
        assert ways[one]["unlike_plain"] == [] and ways[one]["loss_max_diff"] < 1e-2, ways[one]
        plain, whole = ways["plain DDP"]["bucket_bytes"], ways[one]["bucket_bytes"]
        assert len(whole) == 1 and sum(whole) == sum(plain) and (len(plain) > 1 or sum(plain) <= 25 << 20), \
            (plain, whole)
        assert "its all-reduces after backward, by the means" in text, text[-3000:]
    said = "in turn: each way in 2 rounds of 2-step blocks"
    assert said in text and "noise: plain against plain" in text, text[-3000:]
