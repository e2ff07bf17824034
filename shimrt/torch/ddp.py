"""Overlap in a DDP training loop: shimrt as DistributedDataParallel's communication hook.

::

    model = DDP(model, device_ids=[local_rank])        # as before (torchrun, one process per GPU)
    ov = shimrt.torch.overlap(model, policy="auto")    # + 1 line
    for x, y in data:
        with ov.step():                                # + 1 line: the policy's compute side
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    print(ov.report()["policy"])                       # what auto kept, and its trials
    ov.close()

Under a shimrt policy, :func:`overlap` registers a comm hook (``ddp.register_comm_hook``) that
all-reduces each of DDP's buckets through a shimrt Communicator made from the DDP's process group
(same ranks, the rendezvous torchrun already did), averaging as DDP does (ncclAvg: each rank's
gradient times 1/world size, then summed; DDP multiplies by 1/world size, then sums), on the
policy's stream (:class:`~shimrt.torch.hook.Lane`): the stream first waits for the one current
when DDP calls the hook, and DDP's end of backward waits for the all-reduce on the GPU, never on
the host. ``ov.step()`` applies the policy's compute side around the user's forward, backward and
optimizer step (shaping through the Interposer, an SM partition, cuBLAS's carveout; see
:mod:`shimrt.torch.policies`).

``ddp`` is plain DDP itself: no hook is registered, and ``ov.step()`` does nothing but count.
``policy="auto"`` times plain DDP, without any hook, beside every candidate in rounds over the
first steps, then the fastest few again beside it, and keeps the fastest by the slowest rank's
mean step time, plain DDP unless another is more than ``margin`` faster
(:mod:`shimrt.torch.trials`). The candidates run through a twin of the DDP that carries the hook
(:mod:`shimrt.torch.twin`; one more copy of the gradients in GPU memory until auto decides), so
that a hook, which DDP can never lose once registered, is registered on the user's DDP only when
a policy that needs it won; when plain DDP wins, the job runs as if :func:`overlap` had never been
called. ``ov.report()`` says what auto measured plain DDP at, and the host time per bucket and
per step of each policy (:class:`~shimrt.torch.hook.HostCost`).

16-bit gradients over a world size that is not a power of two are scaled by 1/size in float
before a sum, as DDP does (ncclAvg would scale in 16 bits). Not supported: sparse gradients
(refused when a bucket comes), ``Join``, and a DDP that has a comm hook already; auto also needs
a DDP its twin can mirror (no ``mixed_precision``, no delayed all-reduces). ``no_sync()`` steps,
DDP's bucket rebuild after the first step, ``gradient_as_bucket_view`` either way and bf16 or
fp32 buckets need nothing more. A collective whose peer is gone is aborted by shimrt's watchdog
after ``timeout`` seconds; the next bucket, ``step()``'s end, or :meth:`Overlap.close` raises its
:class:`CollectiveError`. For a loop without DDP, :class:`~shimrt.torch.step.GradientBuckets` and
:class:`~shimrt.torch.step.NcclBuckets` take the same policies.
"""

from __future__ import annotations

import contextlib
import socket
import weakref
from collections.abc import Iterable
from typing import Any, Iterator

from .. import validate
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..lifetime import close_each
from ..stream import Stream
from . import policies as vocabulary
from .hook import HostCost, Lane, now
from .interop import require_torch, sm_carveout
from .interop import stream as torch_stream
from .step import Policy, compute_context
from .trials import Trials
from .twin import Twin, unsupported

# The SM partitions the policies run compute on, (GPU index, SMs) -> (kept, rest, rest's stream),
# made on first use and held for the process (never closed), shared by every overlap in it. DDP
# waits for a hook's future on the step's stream, so torch's caching allocator records that stream
# on DDP's buckets and records an event on it whenever a bucket is freed: at the DDP's collection
# or the interpreter's end, after anything shimrt could close. An event recorded on a destroyed
# stream aborts the process (seen on the H200); a live idle partition costs next to nothing.
_PARTITIONS: dict[tuple[int, int], tuple[Any, Any, Any]] = {}


def overlap(ddp: Any, policy: Any = "auto", *, sms: Iterable[int] = (32, 48, 64), trial_steps: int = 3,
            margin: float = 0.01, timeout: float = 300.0, quiet: bool = False) -> "Overlap":
    """Overlap ``ddp``'s all-reduces with its compute under ``policy`` (a name of
    :mod:`shimrt.torch.policies`, a :class:`Policy`, or ``"auto"``); see the module's docstring.
    ``sms``: the SMs auto's partition and carveout candidates keep for NCCL; ``trial_steps``: the
    rounds of auto's search and of its confirmation (a round: one warm-up step and one timed step
    per candidate); ``margin``: how much faster than plain DDP auto's pick must be; ``timeout``:
    seconds a collective may take before it is aborted; ``quiet``: rank 0 says nothing when auto
    decides. Collective over the DDP's ranks: every rank calls it, with the same arguments."""
    require_torch()
    return Overlap(ddp, policy, sms=sms, trial_steps=trial_steps, margin=margin, timeout=timeout, quiet=quiet)


def _hook(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses annotations other than its own classes
    """DDP's comm hook (a plain function, as ``register_comm_hook`` takes it)."""
    return state.all_reduce(bucket)


def _twin_hook(state, bucket):  # noqa: ANN001, ANN202
    """The twin's comm hook: its state is a weak reference to the Overlap (a reducer's hold on its
    state is invisible to Python's collector, and the Overlap holds the twin)."""
    ov = state()
    if ov is None:
        raise UsageError("the shimrt Overlap behind this DDP twin is gone")
    return ov.all_reduce(bucket)


class Overlap:
    """What :func:`overlap` returns: ``step()``, ``report()``, ``close()``, and DDP's hook state."""

    def __init__(self, ddp: Any, policy: Any, *, sms: Iterable[int], trial_steps: int, margin: float,
                 timeout: float, quiet: bool):
        import torch
        import torch.distributed as dist

        from ..nccl import CommOptions
        self._torch, self._dist = torch, dist
        # The plain arguments first (no GPU, no collective), then the DDP.
        self.quiet = validate.boolean(quiet, "quiet")
        timeout = CommOptions(timeout=timeout).timeout
        sms = vocabulary.kept_sms(sms, "sms")
        trial_steps = validate.integer(trial_steps, "trial_steps", least=1, most=1000)
        margin = validate.number(margin, "margin", least=0, most=0.5)
        if not isinstance(policy, (str, Policy)):  # before any comparison: a numpy array compares elementwise
            raise UsageError(f"policy must be 'auto', a policy's name or a Policy, not {validate.shown(policy)}")
        policy = policy if isinstance(policy, Policy) else str(policy)
        if policy != "auto":
            # The name's own checks; its channels are sized once the ranks are known.
            named = vocabulary.parse(policy)
            if not named.overlap:
                raise UsageError(f"policy {named.name!r} all-reduces after backward, which DDP's hook cannot defer; "
                                 "under DDP the no-overlap reference is 'ddp'")
        index = _check_ddp(torch, dist, ddp)
        if policy == "auto" and (why := unsupported(ddp)) is not None:  # before any collective
            raise UsageError(f"auto cannot time its policies beside this DDP: {why}; give overlap() a fixed policy")
        # A weak reference: once the hook is registered, DDP's reducer holds this object as its state,
        # a reference Python's collector cannot see, so holding the DDP would keep both alive for good.
        self._ddp = weakref.ref(ddp)
        self.group = ddp.process_group
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.torch_device = torch.device("cuda", index)
        self.device = Device(index)
        self.ranks_per_gpu = self._ranks_per_gpu()
        self._comms: dict = {}        # ctas -> Communicator
        self._lanes: dict = {}        # (ctas, priority) -> Lane
        self._partitions: dict = {}   # sms -> (kept, rest, rest's stream), from _PARTITIONS
        self._interposers: dict = {}  # cap -> Interposer
        self.dropped: dict[str, str] = {}
        self.cost = HostCost()
        self._active: Policy | None = None
        self._window: Any = None
        self._reduced = False
        self._counting: list[int] = [0, 0, 0, 0]
        self._timed: list = []        # (trial index, start event, end event) not yet read
        self._twin: Twin | None = None
        self.hooked = False           # the hook is registered on the user's DDP
        self.closed = False
        try:
            if policy == "auto":
                kinds = [k for k in vocabulary.KINDS if k not in ("sequential", "auto")]
                candidates = self._usable(vocabulary.candidates(sms, self.ranks_per_gpu, kinds))
                self.auto, self.trials = True, Trials(candidates, steps=trial_steps, margin=margin, reference="ddp")
            else:
                fixed = vocabulary.parse(policy, self.ranks_per_gpu)
                if self._usable([fixed]) == []:
                    raise UsageError(f"policy {fixed.name!r} cannot run here: {self.dropped[fixed.name]}")
                self.auto, self.trials = False, Trials.settled(fixed)
            self._make_lanes(timeout)
            if self.auto and len(self.trials.candidates) > 1:
                self._twin = Twin(ddp, weakref.ref(self), _twin_hook)
            elif self.trials.current().comm == "shimrt":
                ddp.register_comm_hook(self, _hook)
                self.hooked = True
        except BaseException:
            with contextlib.suppress(Exception):  # the error that matters is the one raised
                self._close_parts()
            raise

    # --- set-up ---
    def _ranks_per_gpu(self) -> int:
        """How many of the group's ranks share this rank's GPU (one per GPU under torchrun, two
        on one GPU under MPS): NCCL's channels are sized by it."""
        props = self._torch.cuda.get_device_properties(self.torch_device)
        me = (socket.gethostname(), str(getattr(props, "uuid", self.torch_device.index)))
        everyone: list = [None] * self.size
        with self._torch.cuda.device(self.torch_device):
            self._dist.all_gather_object(everyone, me, group=self.group)
        return sum(x == me for x in everyone)

    def _usable(self, candidates: list[Policy]) -> list[Policy]:
        """The candidates every rank can run (a partition needs green contexts), agreed over the
        ranks; why the others were dropped goes to :attr:`dropped`."""
        mine, fatal = [], None
        for p in candidates:
            try:
                if fatal is not None:
                    continue
                if p.partition is not None:
                    self._partition_stream(p.partition)
                if p.cap is not None and p.cap not in self._interposers:
                    from ..overlap.interpose import Interposer
                    self._interposers[p.cap] = Interposer(self.device, p.cap)
                if p.carveout is not None:
                    with sm_carveout(None):  # UsageError where this torch has no carveout
                        pass
                mine.append(p.name)
            except ShimrtError as exc:
                if getattr(exc, "sticky", False):
                    fatal = exc  # raised after the others heard: they would wait for this rank for good
                self.dropped[p.name] = f"{type(exc).__name__}: {exc}"
        everyone: list = [None] * self.size
        with self._torch.cuda.device(self.torch_device):
            self._dist.all_gather_object(everyone, None if fatal else mine, group=self.group)
        if fatal is not None:
            raise fatal
        if None in everyone:
            raise ShimrtError(f"rank {everyone.index(None)} could not set the policies up (its own error says why)")
        for names in everyone:
            for p in candidates:
                if p.name not in names and p.name not in self.dropped:
                    self.dropped[p.name] = "another rank cannot run it"
        return [p for p in candidates if p.name not in self.dropped]

    def _partition_stream(self, sms: int) -> Stream:
        if sms not in self._partitions:
            key = (self.device.index, sms)
            if key not in _PARTITIONS:
                kept, rest = self.device.partition(sms)
                made = (kept, rest, rest.stream())
                for thing in made:
                    thing.keep_open()
                _PARTITIONS[key] = made
            self._partitions[sms] = _PARTITIONS[key]
        return self._partitions[sms][2]

    def _make_lanes(self, timeout: float) -> None:
        """One Communicator per channel setting the policies need, over the DDP's ranks (rank 0's
        unique ids reach the others through the process group), and a Lane per setting and
        stream priority."""
        from ..nccl import CommOptions, Communicator, unique_id
        policies = [p for p in self.trials.candidates if p.comm == "shimrt"]
        settings = sorted({p.ctas for p in policies}, key=lambda c: -1 if c is None else c)
        if not settings:
            return
        ids: list[Any] = [[unique_id() for _ in settings] if self.rank == 0 else None]
        with self._torch.cuda.device(self.torch_device):
            self._dist.broadcast_object_list(ids, src=self._dist.get_global_rank(self.group, 0), group=self.group)
        for ctas, uid in zip(settings, ids[0], strict=True):
            options = CommOptions(timeout=timeout, min_ctas=ctas, max_ctas=ctas)
            self._comms[ctas] = Communicator(self.device, uid, self.rank, self.size, options=options)
        for p in policies:
            key = (p.ctas, p.priority)
            if key not in self._lanes:
                comm = self._comms[p.ctas]
                owned = p.priority != "high"
                stream = self.device.stream("low") if owned else comm.stream
                self._lanes[key] = Lane(self._torch, comm, stream, owned=owned, size=self.size,
                                        index=self.device.index)

    # --- the hook ---
    def all_reduce(self, bucket: Any) -> Any:
        """DDP's comm hook: the average of ``bucket`` over the ranks, as a future (see the
        module's docstring)."""
        start = now()
        if self.closed:
            return self._torch_all_reduce(bucket)
        policy = self._active if self._active is not None else self._outside_step()
        self._reduced = True
        future = self._lanes[policy.ctas, policy.priority].all_reduce(bucket)
        if policy.window and self._window is None:  # cuBLAS leaves NCCL its SMs from the first bucket on
            self._window = sm_carveout(policy.carveout)
            self._window.__enter__()
        counts = self._counting
        counts[0] += now() - start
        counts[1] += 1
        return future

    def _torch_all_reduce(self, bucket: Any) -> Any:
        """After :meth:`close`: torch.distributed's all-reduce of the bucket on the DDP's process
        group, as DDP's default hook (``allreduce_hook``) makes it (the hook stays registered)."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        return allreduce_hook(self.group, bucket)

    def _outside_step(self) -> Policy:
        policy = self.trials.current()
        if policy.cap is not None or policy.partition is not None or policy.carveout is not None:
            raise UsageError(f"the policy {policy.name!r} needs each training step inside 'with ov.step():' "
                             "(forward, backward and the optimizer step)")
        self._counting = self.cost.counters(policy.name)
        return policy

    # --- the step ---
    @contextlib.contextmanager
    def step(self) -> Iterator[Policy]:
        """One training step under the policy (auto's trial, or the one kept): its compute side
        around the block, the step timed for auto; yields the policy. Raises the
        :class:`CollectiveError` of a communicator the watchdog aborted."""
        start = now()
        if self.closed:
            raise UsageError("the Overlap is closed")
        if self._active is not None:
            raise UsageError("ov.step() blocks do not nest")
        self.check()  # a communicator aborted since: said before the step starts, not from inside DDP
        policy = self.trials.current()
        counts = self._counting = self.cost.counters(policy.name)
        if policy.comm == "torch" and self.trials.picked is not None:  # plain DDP kept: nothing to do
            counts[2] += now() - start
            counts[3] += 1
            yield policy
            return
        torch = self._torch
        current = torch.cuda.current_stream(self.torch_device)
        timed = self.trials.picked is None
        if timed:
            ddp = self._ddp()
            # A no_sync() step all-reduces nothing: it does not count (plain DDP's steps have no hook to tell).
            synced = ddp is not None and ddp.require_backward_grad_sync
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(current)
        part = self._partitions[policy.partition][2] if policy.partition is not None else None
        if part is not None:  # the partition's stream starts after what came before, and hands back
            torch_stream(part).wait_stream(current)
        self._active, self._reduced = policy, False
        with contextlib.ExitStack() as inside:
            if self._twin is not None and policy.comm == "shimrt":
                inside.enter_context(self._twin.routed())
            inside.enter_context(compute_context(policy, self._interposers.get(policy.cap), part))
            counts[2] += now() - start
            try:
                yield policy
            finally:
                start = now()
                self._active = None
                if self._window is not None:
                    window, self._window = self._window, None
                    window.__exit__(None, None, None)
                if part is not None:
                    current.wait_stream(torch_stream(part))
        self.check()
        if timed:
            end.record(current)
            index = self.trials.done(synced if policy.comm == "torch" else self._reduced)
            if index is not None:
                self._timed.append((index, begin, end))
        counts[2] += now() - start
        counts[3] += 1
        if timed and self.trials.exhausted:  # auto's decision: once, not a step's own cost
            self._decide()

    def _decide(self) -> None:
        torch = self._torch
        for index, begin, end in self._timed:
            end.synchronize()
            self.trials.record(index, begin.elapsed_time(end))
        self._timed = []

        def agree(means: list[float]) -> list[float]:  # the slowest rank's time, on every rank
            t = torch.tensor(means, dtype=torch.float64, device=self.torch_device)
            self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
            return t.tolist()
        picked = self.trials.decide(agree)  # None: the finalists run again first
        if picked is None:
            return
        self._settle(picked)
        if self.rank == 0 and not self.quiet:
            final = {c.name for c in self.trials.final}
            times = ", ".join(f"{n}{'*' if n in final else ''} {t:.2f}" for n, t in self.trials.means.items())
            print(f"shimrt.torch.overlap: auto kept {picked.name} ({picked.describe()}) after "
                  f"{len(self.trials.schedule)} trial steps; mean step ms (* finalists; ddp: plain DDP, no hook): "
                  f"{times}", flush=True)

    def _settle(self, picked: Policy) -> None:
        """Auto kept ``picked``: the twin goes; the user's DDP gets the hook where ``picked``
        needs it, and what no other policy will use is closed."""
        if self._twin is not None:
            self._twin.close()
            self._twin = None
        unused = [lane for key, lane in self._lanes.items() if key != (picked.ctas, picked.priority)
                  or picked.comm != "shimrt"]
        for lane in unused:
            lane.close()
        self._lanes = {k: v for k, v in self._lanes.items() if v not in unused}
        keep = picked.ctas if picked.comm == "shimrt" else object()
        comms = [c for ctas, c in self._comms.items() if ctas != keep]
        interposers = [i for cap, i in self._interposers.items() if cap != picked.cap]
        self._comms = {k: v for k, v in self._comms.items() if k == keep}
        self._interposers = {k: v for k, v in self._interposers.items() if k == picked.cap}
        close_each([*comms, *interposers])
        if picked.comm == "shimrt":
            ddp = self._ddp()
            if ddp is None:
                raise UsageError("the DDP this Overlap serves is gone")
            ddp.register_comm_hook(self, _hook)
            self.hooked = True

    def check(self) -> None:
        """Raise the CollectiveError of a communicator shimrt's watchdog aborted (a peer gone)."""
        for comm in self._comms.values():
            if comm.state.error is not None:
                raise comm.state.error

    # --- results and the end ---
    def report(self) -> dict:
        """The policy in force (None while auto tries), auto's trials and its reference (plain DDP
        without a hook, timed in the same rounds), the host time per policy (the hook per bucket,
        ``ov.step()`` per step), candidates dropped and why."""
        policy = self.trials.picked
        means = self.trials.means if self.auto else {}
        return {"policy": None if policy is None else policy.name,
                "describe": None if policy is None else policy.describe(),
                "hooked": self.hooked,
                "reference": {"policy": "ddp", "what": "plain DDP, no hook, timed in the same rounds",
                              "mean_ms": means.get("ddp")} if self.auto else None,
                "trials": self.trials.report() if self.auto else None,
                "host_us": self.cost.report(),
                "dropped": dict(self.dropped), "ranks": self.size, "ranks_per_gpu": self.ranks_per_gpu}

    def close(self, timeout: float = 120.0) -> None:
        """Wait for the all-reduces and the partitions' work (at most ``timeout`` s each) and close
        what the policies made (not the partitions, which the process keeps: see ``_PARTITIONS``);
        a DDP with the hook then all-reduces through torch.distributed again (its hook stays
        registered)."""
        if self.closed:
            return
        self.closed = True
        try:
            for lane in self._lanes.values():
                lane.stream.synchronize(timeout)
            for _, _, s in self._partitions.values():
                s.synchronize(timeout)
            self.check()
        finally:
            self._close_parts()

    def _close_parts(self) -> None:
        """Close what the policies made, each whatever the others do (the partitions stay: see
        ``_PARTITIONS``)."""
        if self._twin is not None:
            self._twin.close()
            self._twin = None
        things = [*self._lanes.values(), *self._interposers.values(), *self._comms.values()]
        self._lanes, self._partitions, self._interposers, self._comms = {}, {}, {}, {}
        close_each(things)

    def __enter__(self) -> "Overlap":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_ddp(torch: Any, dist: Any, ddp: Any) -> int:
    """The CUDA device index of ``ddp``'s parameters; UsageError for what the hook cannot take."""
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        raise UsageError(f"overlap() takes a torch.nn.parallel.DistributedDataParallel, not {validate.shown(ddp)}")
    if not dist.is_initialized():
        raise UsageError("torch.distributed is not initialised: call torch.distributed.init_process_group first")
    backend = str(dist.get_backend(ddp.process_group)).lower()
    if "nccl" not in backend:
        raise UsageError(f"overlap() needs a DDP over NCCL (its process group's backend is {backend!r}): shimrt "
                         "all-reduces GPU buffers with NCCL; init_process_group('nccl')")
    if getattr(ddp, "_comm_hooks", None):
        raise UsageError("this DDP has a comm hook already (register_comm_hook): DDP takes one for good, and "
                         "overlap() registers its own")
    devices = {p.device for p in ddp.module.parameters()}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise UsageError(f"overlap() needs every parameter on one CUDA device (one process per GPU), not on "
                         f"{sorted(map(str, devices))}")
    index = next(iter(devices)).index
    if ddp.device_ids and list(ddp.device_ids) != [index]:
        raise UsageError(f"the DDP's device_ids {ddp.device_ids} must be its parameters' device, [{index}]")
    return index
