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

:func:`overlap` registers a comm hook (``ddp.register_comm_hook``) that all-reduces each of
DDP's buckets through a shimrt Communicator made from the DDP's process group (same ranks, the
rendezvous torchrun already did), averaging as DDP does (ncclAvg: each rank's gradient times
1/world size, then summed; DDP multiplies by 1/world size, then sums), on the policy's stream:
the hook first makes that stream wait for the stream current when DDP calls it, and returns a
CUDA-aware future completed on that stream, so DDP's end of backward waits for the all-reduce on
the GPU, never on the host. ``ov.step()`` applies the policy's compute side around the user's
forward, backward and optimizer step (shaping through the Interposer, an SM partition, cuBLAS's
carveout; see :mod:`shimrt.torch.policies`), and times the step for auto.

``policy="auto"`` tries every candidate in rounds over the first steps (``ddp`` among them), then
the fastest few again beside ``ddp``, and keeps the fastest by the slowest rank's mean step time,
``ddp`` unless another is more than ``margin`` faster (:mod:`shimrt.torch.trials`). ``ddp`` is
torch.distributed's all-reduce on the DDP's process group, averaged by NCCL where that equals
DDP's scaling (else DDP's default hook, ``allreduce_hook``, which divides in a pass of its own):
as close to hookless DDP as a registered hook can be (a Python future per bucket), not hookless
DDP itself; bench torch's plain-DDP reference is hookless, and its ``ddp (hook)`` way is this. 16-bit
gradients over a world size that is not a power of two are scaled by 1/size in float before a sum,
as DDP does (ncclAvg would scale in 16 bits). Not supported: sparse gradients (refused when a
bucket comes) and ``Join``. ``no_sync()`` steps, DDP's bucket rebuild after the first step,
``gradient_as_bucket_view`` either way and bf16 or fp32 buckets need nothing more. A collective
whose peer is gone is aborted by shimrt's watchdog after ``timeout`` seconds; the next bucket,
``step()``'s end, or :meth:`Overlap.close` raises its :class:`CollectiveError`. For a loop without
DDP, :class:`~shimrt.torch.step.GradientBuckets` and :class:`~shimrt.torch.step.NcclBuckets` take
the same policies.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable
from typing import Any, Iterator

from .. import validate
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..lifetime import close_each
from ..stream import Stream
from . import policies as vocabulary
from .interop import require_torch, sm_carveout
from .interop import stream as torch_stream
from .step import Policy, compute_context
from .trials import Trials

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


class Overlap:
    """What :func:`overlap` returns: the hook's state, ``step()``, ``report()``, ``close()``."""

    def __init__(self, ddp: Any, policy: Any, *, sms: Iterable[int], trial_steps: int, margin: float,
                 timeout: float, quiet: bool):
        import torch
        import torch.distributed as dist

        from ..nccl import CommOptions
        self._torch, self._dist = torch, dist
        # The plain arguments first (no GPU, no collective), then the DDP.
        self.quiet = validate.boolean(quiet, "quiet")
        timeout = CommOptions(timeout=timeout).timeout
        if isinstance(sms, (str, bytes)) or not isinstance(sms, Iterable):
            raise UsageError(f"sms must be a list of SM counts, not {validate.shown(sms)}")
        sms = [validate.integer(k, "sms", least=1) for k in sms]
        trial_steps = validate.integer(trial_steps, "trial_steps", least=1, most=1000)
        margin = validate.number(margin, "margin", least=0, most=0.5)
        if policy != "auto":
            vocabulary.parse(policy)  # the name's own checks; its channels are sized once the ranks are known
        index = _check_ddp(torch, dist, ddp)
        # Not the DDP itself: its reducer holds this object as the hook's state, a reference Python's
        # collector cannot see, so holding the DDP here would keep both (and the model) alive for good.
        self.group = ddp.process_group
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.torch_device = torch.device("cuda", index)
        self.device = Device(index)
        self.ranks_per_gpu = self._ranks_per_gpu()
        self._comms: dict = {}        # ctas -> Communicator
        self._streams: dict = {}      # (ctas, priority) -> (shimrt stream, torch stream)
        self._partitions: dict = {}   # sms -> (kept, rest, rest's stream), from _PARTITIONS
        self._interposers: dict = {}  # cap -> Interposer
        self.dropped: dict[str, str] = {}
        self._active: Policy | None = None
        self._window: Any = None
        self._reduced = False
        self._timed: list = []        # (trial index, start event, end event) not yet read
        self.closed = False
        try:
            if policy == "auto":
                kinds = [k for k in vocabulary.KINDS if k not in ("sequential", "auto")]
                candidates = self._usable(vocabulary.candidates(sms, self.ranks_per_gpu, kinds))
                self.auto, self.trials = True, Trials(candidates, steps=trial_steps, margin=margin, reference="ddp")
            else:
                fixed = vocabulary.parse(policy, self.ranks_per_gpu)
                if not fixed.overlap:
                    raise UsageError(f"policy {fixed.name!r} all-reduces after backward, which DDP's hook cannot "
                                     "defer; under DDP the no-overlap reference is 'ddp'")
                if self._usable([fixed]) == []:
                    raise UsageError(f"policy {fixed.name!r} cannot run here: {self.dropped[fixed.name]}")
                self.auto, self.trials = False, Trials.settled(fixed)
            self._make_communicators(timeout)
            ddp.register_comm_hook(self, _hook)  # torch refuses a second hook on one DDP
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

    def _make_communicators(self, timeout: float) -> None:
        """One Communicator per channel setting the policies need, over the DDP's ranks; rank 0's
        unique ids reach the others through the process group."""
        from ..nccl import CommOptions, Communicator, unique_id
        policies = self.trials.candidates
        settings = sorted({p.ctas for p in policies if p.comm == "shimrt"}, key=lambda c: -1 if c is None else c)
        ids: list[Any] = [[unique_id() for _ in settings] if self.rank == 0 else None]
        with self._torch.cuda.device(self.torch_device):
            self._dist.broadcast_object_list(ids, src=self._dist.get_global_rank(self.group, 0), group=self.group)
        for ctas, uid in zip(settings, ids[0], strict=True):
            options = CommOptions(timeout=timeout, min_ctas=ctas, max_ctas=ctas)
            self._comms[ctas] = Communicator(self.device, uid, self.rank, self.size, options=options)

    def _stream_of(self, policy: Policy) -> tuple[Any, Any, Any]:
        """(communicator, shimrt stream, torch stream) of ``policy``'s all-reduces."""
        comm = self._comms[policy.ctas]
        key = (policy.ctas, policy.priority)
        if key not in self._streams:
            s = comm.stream if policy.priority == "high" else self.device.stream("low")
            self._streams[key] = (s, torch_stream(s))
        return (comm, *self._streams[key])

    # --- the hook ---
    def all_reduce(self, bucket: Any) -> Any:
        """DDP's comm hook: the average of ``bucket`` over the ranks, as a future (see the
        module's docstring)."""
        torch = self._torch
        if self.closed:
            return self._torch_all_reduce(bucket)
        policy = self._active if self._active is not None else self._outside_step()
        self._reduced = True
        if policy.comm == "torch":
            return self._torch_all_reduce(bucket)
        buf = bucket.buffer()
        if buf.is_sparse:
            raise UsageError("shimrt.torch.overlap takes dense gradients only (a sparse embedding's bucket came)")
        comm, stream, ts = self._stream_of(policy)
        if policy.window and self._window is None:  # cuBLAS leaves NCCL its SMs from the first bucket on
            self._window = sm_carveout(policy.carveout)
            self._window.__enter__()
        ts.wait_stream(torch.cuda.current_stream(self.torch_device))
        if self._exact_avg(buf):
            comm.all_reduce(buf, op="avg", stream=stream)
        else:  # as DDP: times 1/size in float, rounded once, then summed
            with torch.cuda.stream(ts):
                buf.mul_(1.0 / self.size)
            comm.all_reduce(buf, op="sum", stream=stream)
        future = torch.futures.Future(devices=[self.torch_device])
        with torch.cuda.stream(ts):  # DDP's stream waits for this one, not the host for the GPU
            future.set_result(buf)
        return future

    def _exact_avg(self, buf: Any) -> bool:
        """Whether ncclAvg averages ``buf`` as DDP does: it scales by 1/size in the buffer's own
        type (NCCL's hostToDevRedOp), which for 16-bit floats equals DDP's float scaling only
        when 1/size is a power of two."""
        return buf.element_size() >= 4 or self.size & (self.size - 1) == 0

    def _torch_all_reduce(self, bucket: Any) -> Any:
        """torch.distributed's all-reduce of the bucket on the DDP's process group, averaged by
        NCCL (ReduceOp.AVG) where that equals DDP's own scaling (see :meth:`_exact_avg`), so that
        no pass of its own divides the bucket first, as DDP's default hook (``allreduce_hook``)
        does; else that hook."""
        buf = bucket.buffer()
        if not self._exact_avg(buf):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            return allreduce_hook(self.group, bucket)
        work = self._dist.all_reduce(buf, op=self._dist.ReduceOp.AVG, group=self.group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    def _outside_step(self) -> Policy:
        policy = self.trials.current()
        if self.auto or policy.cap is not None or policy.partition is not None or policy.carveout is not None:
            raise UsageError(f"the policy {'auto' if self.auto else repr(policy.name)} needs each training "
                             "step inside 'with ov.step():' (forward, backward and the optimizer step)")
        return policy

    # --- the step ---
    @contextlib.contextmanager
    def step(self) -> Iterator[Policy]:
        """One training step under the policy (auto's trial, or the one kept): its compute side
        around the block, the step timed for auto; yields the policy. Raises the
        :class:`CollectiveError` of a communicator the watchdog aborted."""
        torch = self._torch
        if self.closed:
            raise UsageError("the Overlap is closed")
        if self._active is not None:
            raise UsageError("ov.step() blocks do not nest")
        self.check()  # a communicator aborted since: said before the step starts, not from inside DDP
        policy = self.trials.current()
        current = torch.cuda.current_stream(self.torch_device)
        timed = self.trials.picked is None
        if timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(current)
        part = self._partitions[policy.partition][2] if policy.partition is not None else None
        if part is not None:  # the partition's stream starts after what came before, and hands back
            torch_stream(part).wait_stream(current)
        self._active, self._reduced = policy, False
        try:
            with compute_context(policy, self._interposers.get(policy.cap), part):
                yield policy
        finally:
            self._active = None
            if self._window is not None:
                window, self._window = self._window, None
                window.__exit__(None, None, None)
            if part is not None:
                current.wait_stream(torch_stream(part))
        self.check()
        if timed:
            end.record(current)
            index = self.trials.done(self._reduced)
            if index is not None:
                self._timed.append((index, start, end))
            if self.trials.exhausted:
                self._decide()

    def _decide(self) -> None:
        torch = self._torch
        for index, start, end in self._timed:
            end.synchronize()
            self.trials.record(index, start.elapsed_time(end))
        self._timed = []

        def agree(means: list[float]) -> list[float]:  # the slowest rank's time, on every rank
            t = torch.tensor(means, dtype=torch.float64, device=self.torch_device)
            self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
            return t.tolist()
        picked = self.trials.decide(agree)  # None: the finalists run again first
        if picked is not None and self.rank == 0 and not self.quiet:
            final = {c.name for c in self.trials.final}
            times = ", ".join(f"{n}{'*' if n in final else ''} {t:.2f}" for n, t in self.trials.means.items())
            print(f"shimrt.torch.overlap: auto kept {picked.name} ({picked.describe()}) after "
                  f"{len(self.trials.schedule)} trial steps; mean step ms (* finalists): {times}", flush=True)

    def check(self) -> None:
        """Raise the CollectiveError of a communicator shimrt's watchdog aborted (a peer gone)."""
        for comm in self._comms.values():
            if comm.state.error is not None:
                raise comm.state.error

    # --- results and the end ---
    def report(self) -> dict:
        """The policy in force (None while auto tries), auto's trials, candidates dropped and why."""
        policy = self.trials.picked
        return {"policy": None if policy is None else policy.name,
                "describe": None if policy is None else policy.describe(),
                "trials": self.trials.report() if self.auto else None,
                "dropped": dict(self.dropped), "ranks": self.size, "ranks_per_gpu": self.ranks_per_gpu}

    def close(self, timeout: float = 120.0) -> None:
        """Wait for the all-reduces and the partitions' work (at most ``timeout`` s each) and close
        what the policies made (not the partitions, which the process keeps: see ``_PARTITIONS``);
        DDP then all-reduces through torch.distributed again (its hook stays registered)."""
        if self.closed:
            return
        self.closed = True
        try:
            for s, _ in self._streams.values():
                s.synchronize(timeout)
            for _, _, s in self._partitions.values():
                s.synchronize(timeout)
            self.check()
        finally:
            self._close_parts()

    def _close_parts(self) -> None:
        """Close what the policies made, each whatever the others do (the partitions stay: see
        ``_PARTITIONS``)."""
        things = [s for s, _ in self._streams.values() if not any(s is c.stream for c in self._comms.values())]
        things += [*self._interposers.values(), *self._comms.values()]
        self._streams, self._partitions, self._interposers, self._comms = {}, {}, {}, {}
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
    devices = {p.device for p in ddp.module.parameters()}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise UsageError(f"overlap() needs every parameter on one CUDA device (one process per GPU), not on "
                         f"{sorted(map(str, devices))}")
    index = next(iter(devices)).index
    if ddp.device_ids and list(ddp.device_ids) != [index]:
        raise UsageError(f"the DDP's device_ids {ddp.device_ids} must be its parameters' device, [{index}]")
    return index
