"""A policy's compute side: the device resources it needs, made on first use and held for a run
(SM partitions, torch's compute on a stream of all but K SMs, :class:`~shimrt.torch.policies.Partition`;
Interposers, every kernel capped at N blocks per SM, :class:`~shimrt.torch.policies.Shaping`), and
:func:`compute_context`, torch's compute as the policy shapes it with them (or with cuBLAS's
carveout, :class:`~shimrt.torch.policies.Carveout`), and :class:`Window`, a windowed carveout's
(held only while collectives run beside compute), opened alike by :func:`shimrt.torch.overlap`'s
gradient hook (:func:`window_hook`) and ``bench torch``'s ``NcclBuckets(beside=window.held)``.
One object serves :func:`shimrt.torch.overlap` and ``bench torch``; they differ only in whether
the partitions outlive it (``keep_partitions``).

An :func:`~shimrt.torch.overlap` keeps its partitions for the process, shared by every overlap in
it: torch's caching allocator records the step's stream on tensors made there, and records an
event on it whenever one is freed, at the model's collection or the interpreter's end, after
anything shimrt could close. An event recorded on a destroyed stream aborts the process (seen on
the H200); a live idle partition costs next to nothing. ``bench torch`` closes its own at the end
of its run, when its models are gone.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection, ContextManager, Iterator

from .. import validate
from ..device import Device, Partition
from ..errors import DriverError, UsageError
from ..lifetime import close_each
from ..stream import Stream
from ..targets import MAX_SMS
from .interop import accumulation_across_streams, sm_carveout
from .interop import stream as torch_stream
from .policies import Policy

__all__ = ["Resources", "Window", "window_hook"]

if TYPE_CHECKING:
    from ..overlap.interpose import Interposer


@dataclass(frozen=True)
class SmPartition:
    """A partition of ``sms`` SMs kept for NCCL: ``kept`` (those SMs), ``rest`` (the others) and
    ``stream``, a stream of ``rest`` that torch's compute runs on."""

    kept: Partition
    rest: Partition
    stream: Stream

    def parts(self) -> list:
        """What it owns, the stream before the partitions (the order they are closed in)."""
        return [self.stream, self.kept, self.rest]


# The process's kept partitions, (GPU index, SMs kept) -> SmPartition, never closed (see above).
_KEPT: dict[tuple[int, int], SmPartition] = {}


class Resources:
    """A run's partitions (by SMs kept) and Interposers (by cap) on ``device``, each made once on
    first use. :meth:`close` closes the Interposers, and the partitions unless ``keep_partitions``
    (then the process keeps them, shared with every other Resources that keeps its own)."""

    def __init__(self, device: Device, *, keep_partitions: bool):
        self.device, self.keep_partitions = device, keep_partitions
        self._partitions: dict[int, SmPartition] = {}
        self._interposers: dict[int, Interposer] = {}

    def prepare(self, policy: Policy) -> None:
        """Make what ``policy``'s compute side needs now, so that a policy this device or this
        torch cannot run is refused here (ShimrtError: no green contexts, no carveout knob),
        before any step."""
        if policy.partition is not None:
            self.partition(policy.partition)
        if policy.cap is not None:
            self.subscribable(self.interposer(policy.cap))
        if policy.carveout is not None:
            with sm_carveout(None):  # UsageError where this torch has no carveout
                pass

    def partition(self, sms: int) -> SmPartition:
        """The partition keeping ``sms`` SMs for NCCL (the driver may round the count up:
        ``partition(sms).kept.target.num_sms`` is what it kept)."""
        if sms not in self._partitions:
            key = (self.device.index, sms) if self.keep_partitions else None
            made = _KEPT.get(key) if key is not None else None
            if made is None:
                kept, rest = self.device.partition(sms)
                try:
                    made = SmPartition(kept, rest, rest.stream())
                except BaseException:
                    close_each([kept, rest])
                    raise
                if key is not None:
                    for thing in made.parts():
                        thing.keep_open()
                    _KEPT[key] = made
            self._partitions[sms] = made
        return self._partitions[sms]

    def interposer(self, cap: int) -> Interposer:
        """The Interposer capping every kernel at ``cap`` blocks per SM."""
        if cap not in self._interposers:
            from ..overlap.interpose import Interposer
            self._interposers[cap] = Interposer(self.device, cap)
        return self._interposers[cap]

    @staticmethod
    def subscribable(interposer: "Interposer") -> None:
        """UsageError, saying why, where ``interposer`` cannot take CUPTI's one subscriber of the
        process now: another tool holds it (torch.profiler keeps it once it has profiled, and
        Nsight Systems and Compute take it), so a shaping policy would fail at its first step."""
        try:
            with interposer:  # subscribes, and unsubscribes at once: no launch in between
                pass
        except DriverError as exc:
            if exc.name != "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED":
                raise
            raise UsageError("shaping interposes launches through CUPTI, whose one subscriber per process another "
                             "tool holds here (torch.profiler keeps it once it has profiled; Nsight Systems and "
                             "Nsight Compute take it)") from None

    def stream_of(self, policy: Policy) -> Stream | None:
        """The stream ``policy``'s compute runs on: its partition's, or None (torch's own)."""
        return self.partition(policy.partition).stream if policy.partition is not None else None

    def context(self, policy: Policy) -> ContextManager[None]:
        """torch's compute as ``policy`` shapes it (:func:`compute_context`)
        with this run's partition and Interposer."""
        return compute_context(policy, self.interposer(policy.cap) if policy.cap is not None else None,
                               self.stream_of(policy))

    def settle(self, policy: Policy) -> Callable[[], None] | None:
        """What runs after each warm-up step of ``policy`` (its Interposer learns the kernels)."""
        return self.interposer(policy.cap).settle if policy.cap is not None else None

    def held(self) -> dict:
        """What this run holds now: the SMs kept by each partition (the process keeps them: see
        the module's docstring) and the caps of the open Interposers."""
        return {"partitions_sms": sorted(self._partitions), "interposers_caps": sorted(self._interposers)}

    def synchronize(self, timeout: float) -> None:
        """Wait for the work on the partitions' streams, at most ``timeout`` s each."""
        for part in self._partitions.values():
            part.stream.synchronize(timeout)

    def close_interposers(self, keep: Collection[int] = ()) -> None:
        """Close the Interposers but those of the caps in ``keep`` (each whatever the others do):
        they learn a model's kernels, and the next model starts with new ones; auto keeps its
        pick's."""
        things = [i for cap, i in self._interposers.items() if cap not in keep]
        self._interposers = {cap: i for cap, i in self._interposers.items() if cap in keep}
        close_each(things)

    def close(self) -> None:
        """Close the Interposers and the partitions this object made (not the process's kept
        ones), each whatever the others do."""
        parts = [] if self.keep_partitions else [x for p in self._partitions.values() for x in p.parts()]
        self._partitions = {}
        try:
            self.close_interposers()
        finally:
            close_each(parts)


@contextlib.contextmanager
def compute_context(policy: Policy, interposer: Interposer | None = None,
                    partition_stream: Stream | None = None) -> Iterator[None]:
    """torch's compute as ``policy`` shapes it: on ``partition_stream`` (a shimrt Stream of an SM
    partition), with cuBLAS's carveout, or inside ``interposer``'s block."""
    if not isinstance(policy, Policy):
        raise UsageError(f"policy must be a Policy, not {validate.shown(policy)}")
    import torch
    with contextlib.ExitStack() as stack:
        if policy.partition is not None:
            if partition_stream is None:
                raise UsageError(f"policy {policy.name!r} needs the partition's stream")
            stack.enter_context(torch.cuda.stream(torch_stream(partition_stream)))
            stack.enter_context(accumulation_across_streams())  # DDP's accumulators stay on their stream
        if policy.carveout is not None and not policy.window:  # a window: Window holds it (below)
            stack.enter_context(sm_carveout(policy.carveout))
        if policy.cap is not None:
            if interposer is None:
                raise UsageError(f"policy {policy.name!r} needs an Interposer")
            stack.enter_context(interposer)
        yield


class Window:
    """A windowed carveout (``windowed-carveout:K``): cuBLAS leaves ``sms`` SMs free from
    :meth:`open` (the first gradient, or the first bucket launched) to :meth:`close` (the step's
    end, or the all-reduces joined). :meth:`aim` sets the SMs of the next opening (None: no
    window, :meth:`open` does nothing), so that one Window serves a run's steps under changing
    policies. Opening twice holds it once; closing an unopened one does nothing."""

    def __init__(self, sms: int | None = None):
        self._sms: int | None = None
        self._held: Any = None
        self.aim(sms)

    def aim(self, sms: int | None) -> None:
        """The SMs the next :meth:`open` leaves free (None: none)."""
        self._sms = None if sms is None else validate.integer(sms, "Window sms", least=0, most=MAX_SMS)

    @property
    def is_open(self) -> bool:
        return self._held is not None

    def open(self) -> None:
        """Enter the carveout, unless it is held already or nothing is aimed at."""
        if self._sms is not None and self._held is None:
            held = sm_carveout(self._sms)
            held.__enter__()
            self._held = held

    def close(self) -> None:
        """Leave the carveout if it is held (torch's previous carveout and BLAS back)."""
        held, self._held = self._held, None
        if held is not None:
            held.__exit__(None, None, None)

    def clear(self) -> None:
        """Close it and aim at nothing: no window until the next :meth:`aim`."""
        self._sms = None
        self.close()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The window as a context manager (``NcclBuckets(beside=window.held)``)."""
        self.open()
        try:
            yield
        finally:
            self.close()


def window_hook(param: Any, window: Window) -> Any:
    """A post-accumulate-grad hook on ``param`` (the one registered last: DDP's first bucket
    starts with it, FSDP2's last group holds it; its gradient is expected first) that opens
    ``window``, held by a weak reference (the hook never keeps it alive). Its removable handle."""
    ref = weakref.ref(window)

    def opened(_param: Any) -> None:
        w = ref()
        if w is not None:
            w.open()
    return param.register_post_accumulate_grad_hook(opened)
