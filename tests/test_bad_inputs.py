"""The public API refuses every bad input clearly, without a GPU: a UsageError (CollectiveError for
the NCCL library) whose message names what is allowed and the value given, never a traceback from
deep inside and never a value silently taken.

One test per class of bad input (bools for numbers, non-numbers, NaN and infinity, out-of-range
numbers, bad strings, bad booleans, wrong lengths, timeouts), each over every place that takes such a
value; then the cases of issue 13 one by one. Objects that need a device (Stream, Event, Kernel,
Buffer) are real objects on a stand-in device that has no driver: their checks all run before any
driver call. The same checks on a real device are in tests/gpu/test_bad_inputs_gpu.py. Then the
cases of issue 24: ints beyond any float, lone surrogates, and values beyond what a C int, an
unsigned int or any GPU takes.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

import shimrt
from shimrt import CollectiveError, UsageError, kernels, occupancy, targets, validate
from shimrt.cuda import rtc
from shimrt.device import Device, host_array, partition_sms, stream_priority
from shimrt.kernel import Kernel
from shimrt.memory import Buffer, as_dtype, as_shape
from shimrt.nccl import Communicator, buffer_counts, library
from shimrt.nccl.config import CommOptions
from shimrt.occupancy import NCCL_2_28_SM90, Footprint
from shimrt.overlap import metrics, planner, specs, workloads
from shimrt.overlap.engine import Engine, Op, Result, Schedule, Timing
from shimrt.overlap.planner import Choice, Problem
from shimrt.overlap.standin import StandInSpec
from shimrt.overlap.workloads import ComputeSpec, ComputeWorkload
from shimrt.program import KernelResources, Program
from shimrt.stream import Event, Stream, timeout_seconds

H200 = targets.get("H200")
RES = {"registers": 32, "static_smem": 0}
PROBLEM = Problem(H200, RES, 256, NCCL_2_28_SM90, 16)
EMPTY_KERNEL = 'extern "C" __global__ void k(int* p) { if (p) *p = 1; }'
HUGE = 2**80


# --- real objects on a stand-in device (no driver: every check runs before a driver call) ------

class _Driver:
    """A driver (backends.Driver) with no GPU: what a kernel of one pointer parameter, at most 256
    threads a block, would report; launches succeed without running."""

    def __getattr__(self, name):  # releases at collection (mem_free, stream_destroy, ...) do nothing
        return lambda *args: None

    def occupancy(self, fn, block_size, dynamic_smem):
        return 1

    def module_function(self, handle, name):
        return "fn"

    def function_attributes(self, fn):
        return {"static_smem": 0, "registers": 32, "max_threads_per_block": 256, "max_dynamic_smem": 48 * 1024}

    def function_param_layout(self, fn):
        return [(0, 8)]

    def launcher(self):
        return lambda *args: (0,)


class _Device:
    """What Stream, Event, Buffer and Kernel read of a Device, with no GPU behind it."""

    driver, index, name, target, total_memory = _Driver(), 0, "stand-in", H200, 1 << 30

    def stream_ref(self, stream):
        return 0

    def activate(self):
        pass


#: A program of one kernel k(int*), as a compile for sm_90 would describe it (no compiler needed here).
PROGRAM = Program(b"\x7fELF stand-in", "", H200, {"k": KernelResources(32, 0, 0, 0, 256)}, name="k.cu")


def _kernel() -> Kernel:
    """A Kernel of one pointer parameter, made as Device.load and Module make one, on the stand-in."""
    from shimrt.kernel import Module
    return Module(_Device(), "handle", PROGRAM)["k"]


KERNEL = _kernel()
BUFFER = Buffer(_Device(), 0x1000, 64, (16,), np.float32, owner=None)
STREAM = Stream(_Device(), "stream")
EVENT = Event(_Device(), "event", True)


class _Work:
    label = "work"


SCHEDULE = Schedule.pair(_Work(), _Work())
RESULT = Result("sequential", Choice("sequential"), [Timing({"compute": np.zeros((4, 3))}, 1.0, None, None)])
SOFTMAX = ComputeSpec("softmax", 4)
SOFTMAX_HOST = workloads.inputs(SOFTMAX)


def _bare(cls, **attributes):
    """An instance whose checks of their arguments run before anything else (a Device, a
    Communicator): only what those checks read is set."""
    obj = object.__new__(cls)
    for name, value in attributes.items():
        setattr(obj, name, value)
    return obj


# --- the places that take each kind of value -----------------------------------------------------
# name -> (call with the value, least, most or None, a regex of what the message says is allowed)

INTS = {
    "occupancy block_size": (lambda v: occupancy.occupancy("H200", block_size=v, registers=32), 1, None),
    "occupancy registers": (lambda v: occupancy.occupancy("H200", block_size=256, registers=v), 0, None),
    "occupancy static_smem": (lambda v: occupancy.occupancy("H200", block_size=256, registers=8, static_smem=v),
                              0, None),
    "max_active_blocks dynamic_smem": (lambda v: occupancy.max_active_blocks("H200", block_size=256, registers=8,
                                                                             dynamic_smem=v), 0, None),
    "occupancy sgprs": (lambda v: occupancy.occupancy("MI250X", block_size=256, registers=8, sgprs=v), 0, None),
    "shape block_size": (lambda v: occupancy.shape("H200", RES, v, resident_blocks=1), 1, None),
    "shape resident_blocks": (lambda v: occupancy.shape("H200", RES, 256, resident_blocks=v), 1, 8),
    "shape resources registers": (lambda v: occupancy.shape("H200", {"registers": v}, 256, resident_blocks=1),
                                  0, None),
    "coresident block_size": (lambda v: occupancy.coresident("H200", RES, v, NCCL_2_28_SM90), 1, None),
    "Footprint blocks": (lambda v: Footprint("f", v, 256, 32, 0, 0), 1, None),
    "Footprint threads": (lambda v: Footprint("f", 1, v, 32, 0, 0), 1, None),
    "Footprint registers": (lambda v: Footprint("f", 1, 256, v, 0, 0), 0, None),
    "Footprint dynamic_smem": (lambda v: Footprint("f", 1, 256, 32, 0, v), 0, None),
    "Footprint.with_threads": (lambda v: NCCL_2_28_SM90.with_threads(v), 1, None),
    "KernelResources registers": (lambda v: KernelResources(v, 0, 0, 0, 256), 0, None),
    "KernelResources max_threads_per_block": (lambda v: KernelResources(8, 0, 0, 0, v), 1, None),
    "Target num_sms": (lambda v: H200.with_(num_sms=v), 1, None),
    "Choice resident_blocks": (lambda v: Choice("shaping", resident_blocks=v), 1, None),
    "Choice dynamic_smem": (lambda v: Choice("shaping", resident_blocks=1, dynamic_smem=v), 0, None),
    "Choice partition_sms": (lambda v: Choice("partition", partition_sms=v), 1, None),
    "Choice comm_blocks": (lambda v: Choice("priority", comm_blocks=v), 1, None),
    "Choice comm_threads": (lambda v: Choice("priority", comm_threads=v), 1, None),
    "Problem compute_block": (lambda v: Problem(H200, RES, v, NCCL_2_28_SM90, 16), 1, 1024),
    "Problem comm_blocks": (lambda v: Problem(H200, RES, 256, NCCL_2_28_SM90, v), 1, None),
    "candidates partition_granularity": (lambda v: planner.candidates(PROBLEM, partition_granularity=v), 1, 132),
    "candidates partition_steps": (lambda v: planner.candidates(PROBLEM, partition_steps=v), 1, 132),
    "candidates threads": (lambda v: planner.candidates(PROBLEM, threads=(v,)), 1, 1024),
    "candidates blocks": (lambda v: planner.candidates(PROBLEM, blocks=(None, v)), 1, None),
    "partition_sms blocks": (lambda v: planner.partition_sms(PROBLEM, blocks=v), 1, None),
    "Op after": (lambda v: Op("comm", _Work(), after=v), 0, None),
    "Engine repeats": (lambda v: Engine(None, SCHEDULE, repeats=v), 1, 10_000),
    "Result.timeline max_blocks": (lambda v: RESULT.timeline(v), 2, None),
    "StandInSpec nbytes": (lambda v: StandInSpec(nbytes=v), 16, None),
    "StandInSpec ranks": (lambda v: StandInSpec(nbytes=1 << 20, ranks=v), 2, 2**30),
    "StandInSpec blocks": (lambda v: StandInSpec(nbytes=1 << 20, blocks=v), 1, 2**31 - 1),
    "StandInSpec dynamic_smem": (lambda v: StandInSpec(nbytes=1 << 20, dynamic_smem=v), 0, None),
    "StandInSpec.chunk blocks": (lambda v: StandInSpec(nbytes=1 << 20).chunk(v), 1, None),
    "StandInSpec.step_ns blocks": (lambda v: StandInSpec(nbytes=1 << 20).step_ns(v), 1, None),
    "ComputeSpec size": (lambda v: ComputeSpec("softmax", v), 1, 2**31 - 1),
    "ComputeSpec sgemm size": (lambda v: ComputeSpec("sgemm", v), 1, 65535 * 128),
    "ComputeSpec block": (lambda v: ComputeSpec("softmax", 64, block=v), 1, 1024),
    "ComputeSpec grid": (lambda v: ComputeSpec("bias_gelu", 64, grid=v), 1, 2**31 - 1),
    "ComputeWorkload seed": (lambda v: ComputeWorkload(None, SOFTMAX, seed=v), 0, None),
    "inputs seed": (lambda v: workloads.inputs(SOFTMAX, v), 0, None),
    "CommOptions min_ctas": (lambda v: CommOptions(min_ctas=v), 1, 64),
    "CommOptions max_ctas": (lambda v: CommOptions(max_ctas=v), 1, 64),
    "CommOptions cga_cluster_size": (lambda v: CommOptions(cga_cluster_size=v), 0, 8),
    "CommOptions.build version": (lambda v: CommOptions().build(v), 0, 2**31 - 1),
    "Communicator rank": (lambda v: Communicator(None, bytes(128), v, 2), 0, 1),
    "Communicator size": (lambda v: Communicator(None, bytes(128), 0, v), 1, 2**31 - 1),
    "buffer_counts count": (lambda v: buffer_counts("all_reduce", v, 2), 0, None),
    "buffer_counts size": (lambda v: buffer_counts("all_reduce", 8, v), 1, None),
    "Device index": (lambda v: Device(v), 0, None),
    "Device.partition sms": (lambda v: partition_sms(v, 132), 1, 131),
    "Device.stream priority": (lambda v: stream_priority(v, (0, -5)), -5, 0),
    "Device.empty shape": (lambda v: as_shape((2, v)), 0, None),
    "Kernel.launch grid": (lambda v: KERNEL.launch(v, 32, BUFFER), 1, 2**31 - 1),
    "Kernel.launch grid y": (lambda v: KERNEL.launch((1, v), 32, BUFFER), 1, 65535),
    "Kernel.launch block": (lambda v: KERNEL.launch(1, v, BUFFER), 1, 256),
    "Kernel.launch block z": (lambda v: KERNEL.launch(1, (1, 1, v), BUFFER), 1, 64),
    "Kernel.launch dynamic_smem": (lambda v: KERNEL.launch(1, 32, BUFFER, dynamic_smem=v), 0, 227 * 1024),
    "Kernel.prepare grid": (lambda v: KERNEL.prepare(v, 32, BUFFER), 1, 2**31 - 1),
    "Kernel.max_active_blocks block_size": (lambda v: KERNEL.max_active_blocks(v), 1, 256),
    "Kernel.shape block_size": (lambda v: KERNEL.shape(v, resident_blocks=1), 1, 256),
    "Kernel.confirm resident_blocks": (lambda v: KERNEL.confirm(32, 0, v), 1, None),
    "Kernel.set_carveout percent": (lambda v: KERNEL.set_carveout(v), 0, 100),
    "Buffer.memset value": (lambda v: BUFFER.memset(v), 0, 255),
    "metrics.blocks origin": (lambda v: metrics.blocks(np.array([1, 2, 3], np.uint64), 1e9, v), 0, 2**64 - 1),
}

# Positive, finite numbers (the timeouts first).
TIMEOUTS = {
    "CommOptions timeout": lambda v: CommOptions(timeout=v),
    "Engine timeout_s": lambda v: Engine(None, SCHEDULE, timeout_s=v),
    "StandInSpec timeout_s": lambda v: StandInSpec(nbytes=1 << 20, timeout_s=v),
    "Device.synchronize timeout": lambda v: _bare(Device).synchronize(v),
    "Stream.synchronize timeout": lambda v: STREAM.synchronize(v),
    "Event.synchronize timeout": lambda v: EVENT.synchronize(timeout=v),
    "Communicator.wait timeout": lambda v: _bare(Communicator).wait(timeout=v),
    "timeout_seconds": lambda v: timeout_seconds(v),
}
POSITIVE = {
    **TIMEOUTS,
    "StandInSpec link_gbps": lambda v: StandInSpec(nbytes=1 << 20, link_gbps=v),
    "planner.estimate t_comp": lambda v: planner.estimate(PROBLEM, v, 1.0),
    "metrics.compute t_comp": lambda v: metrics.compute(v, 1.0, 1.0, 1.0, 1.0, 0.0),
    "metrics.blocks hz": lambda v: metrics.blocks(np.array([1, 2, 3], np.uint64), v, 0),
}
# Finite numbers that may be 0 or negative.
FINITE = {
    "ComputeWorkload alpha": lambda v: ComputeWorkload(None, ComputeSpec("sgemm", 128), alpha=v),
    "ComputeWorkload beta": lambda v: ComputeWorkload(None, ComputeSpec("sgemm", 128), beta=v),
    "inputs beta": lambda v: workloads.inputs(ComputeSpec("sgemm", 128), beta=v),
    "metrics.compute comm_start_delay": lambda v: metrics.compute(1.0, 1.0, 1.0, 1.0, 1.0, v),
}
NUMBERS = {**POSITIVE, **FINITE}

BOOLEANS = {
    "CommOptions blocking": lambda v: CommOptions(blocking=v),
    "compile cache": lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", cache=v),
}

TEXTS = {
    "compile source": lambda v: shimrt.compile(v, "sm_90"),
    "compile name": lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", name=v),
    "compile options item": lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", options=[v]),
    "CommOptions net_name": lambda v: CommOptions(net_name=v),
    "kernels.source": lambda v: kernels.source(v),
    "targets.get": lambda v: targets.get(v),
    "Footprint name": lambda v: Footprint(v, 1, 256, 32, 0, 0),
}

# Places that take one of a few words.
CHOICES = {
    "Choice policy": (lambda v: Choice(v), "sequential, concurrent"),
    "Choice comm_priority": (lambda v: Choice("priority", comm_priority=v), "low, high"),
    "planner.plan policy": (lambda v: planner.plan(v, PROBLEM), "sequential"),
    "Op kind": (lambda v: Op(v, _Work()), "compute, comm"),
    "Schedule.of kind": (lambda v: SCHEDULE.of(v), "compute, comm"),
    "StandInSpec collective": (lambda v: StandInSpec(nbytes=1 << 20, collective=v), "all_reduce"),
    "ComputeSpec kind": (lambda v: ComputeSpec(v, 128), "sgemm, bias_gelu"),
    "CommOptions cta_policy": (lambda v: CommOptions(cta_policy=v), "default, efficiency, zero"),
    "buffer_counts collective": (lambda v: buffer_counts(v, 8, 2), "all_reduce, broadcast"),
    "buffer_counts given": (lambda v: buffer_counts("all_reduce", 8, 2, given=v), "nccl, send, largest"),
    "Device backend": (lambda v: Device(0, v), "cuda, hip"),
    "library.load backend": (lambda v: library.load(v), "cuda, hip"),
    "occupancy target": (lambda v: occupancy.occupancy(v, block_size=256, registers=8), "A100, A40, H100, H200"),
    "shape target": (lambda v: occupancy.shape(v, RES, 256, resident_blocks=1), "A100, A40, H100, H200"),
    "compile target": (lambda v: shimrt.compile(EMPTY_KERNEL, v), "A100, A40, H100, H200"),
}


def _shown(value) -> str:
    """How a refusal shows ``value``: numbers as the Python number they stand for, the rest by repr."""
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return repr(value)


def refused(call, value, allowed: str, exc=UsageError, shown: str | None = None) -> str:
    """``call(value)`` raises ``exc`` whose message says what is allowed and names the value (as
    ``shown`` where the message describes it, as for 127 bytes of a unique id)."""
    with pytest.raises(exc) as info:
        call(value)
    message = str(info.value)
    assert re.search(allowed, message), f"does not say what is allowed ({allowed!r}): {message}"
    names = (shown,) if shown is not None else (_shown(value), repr(value)[:100])
    assert any(n in message for n in names), f"does not name {value!r}: {message}"
    return message


def _int_allowed(least, most) -> str:
    # validate.integer's "an int >= 1" / "an int in 1..64", or a message of its own saying so and a bound.
    return r"must (be|have) .*(int|rank|at most)"


# --- one test per class of bad input ------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False, np.True_])
@pytest.mark.parametrize("site", sorted(INTS))
def test_bools_are_not_ints(site, value):
    call, least, most = INTS[site]
    refused(call, value, _int_allowed(least, most))


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
@pytest.mark.parametrize("site", sorted(NUMBERS))
def test_bools_are_not_numbers(site, value):
    refused(NUMBERS[site], value, "must be a (finite positive|finite) number")


@pytest.mark.parametrize("value", [1.5, 2.0, np.float32(3), "5", "", b"5", ["4"], {}, object(), 1j])
@pytest.mark.parametrize("site", sorted(INTS))
def test_non_ints_are_refused(site, value):
    call, least, most = INTS[site]
    refused(call, value, _int_allowed(least, most))


@pytest.mark.parametrize("value", ["5", "", b"1", [1.0], {}, object(), 1j, None])
@pytest.mark.parametrize("site", sorted(NUMBERS))
def test_non_numbers_are_refused(site, value):
    if value is None and ("synchronize" in site or "wait" in site or "link_gbps" in site):
        pytest.skip("None is the default there (an unbounded wait, an unpaced link)")
    refused(NUMBERS[site], value, "must be a (finite positive|finite) number")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("inf")])
@pytest.mark.parametrize("site", sorted(NUMBERS))
def test_nan_and_infinity_are_refused(site, value):
    refused(NUMBERS[site], value, "must be a (finite positive|finite) number")


@pytest.mark.parametrize("site", sorted(INTS))
def test_ints_out_of_range_are_refused(site):
    call, least, most = INTS[site]
    for value in (least - 1, least - 1000, np.int64(least - 1)):
        refused(call, value, _int_allowed(least, most))
    if most is not None:
        for value in (most + 1, HUGE, np.uint64(2**64 - 1) if most < 2**64 - 1 else HUGE):
            message = refused(call, value, _int_allowed(least, most))
            assert str(most) in message, f"does not say the largest allowed, {most}: {message}"


@pytest.mark.parametrize("value", [0, -1, -0.5, np.int64(-3)])
@pytest.mark.parametrize("site", sorted(POSITIVE))
def test_numbers_must_be_positive(site, value):
    refused(POSITIVE[site], value, "must be a finite positive number")


@pytest.mark.parametrize("site", sorted(FINITE))
def test_floats_beyond_float32_are_refused_where_the_kernel_takes_float32(site):
    if site.startswith("metrics"):
        pytest.skip("a time in ms is a float64")
    refused(FINITE[site], 1e39, r"must be a finite number in")


@pytest.mark.parametrize("value", ["", "a\0b", None, 5, b"bytes", ["a"]])
@pytest.mark.parametrize("site", sorted(TEXTS))
def test_strings_must_be_text_without_nul(site, value):
    if site == "compile options item" and value == "":
        value = "\0"
    if site == "CommOptions net_name" and value is None:
        pytest.skip("None leaves NCCL's default")
    message = refused(TEXTS[site], value, "must be|must name")
    assert "string" in message or "one of" in message or "name" in message


@pytest.mark.parametrize("value", ["no", "yes", "False", 0, 1, 1.0, [], np.int64(1)] + [None])
@pytest.mark.parametrize("site", sorted(BOOLEANS))
def test_booleans_must_be_bools(site, value, cache_dir):
    if value is None and site == "compile cache":
        pytest.skip("cache=None follows SHIMRT_DISABLE_CACHE")
    refused(BOOLEANS[site], value, "must be True or False")


@pytest.mark.parametrize("value", ["fastest", "", None, 0, True, ["sgemm"], {"a": 1}, "a\0b"])
@pytest.mark.parametrize("site", sorted(CHOICES))
def test_words_must_be_one_of_the_allowed(site, value):
    call, allowed = CHOICES[site]
    if value is None and site in ("CommOptions cta_policy", "Device backend"):
        pytest.skip("None is the default there")
    refused(call, value, re.escape(allowed))


@pytest.mark.parametrize("value", [True, math.inf, math.nan, 0, -1, "5", 1e300, None])
@pytest.mark.parametrize("site", sorted(TIMEOUTS))
def test_timeouts_are_positive_finite_numbers_only(site, value):
    if value is None:
        if "synchronize" in site or "wait" in site:
            pytest.skip("None is the unbounded wait there")
    refused(TIMEOUTS[site], value, "must be a finite positive number")


def test_timeouts_take_numpy_numbers_and_ints():
    assert timeout_seconds(np.float32(1.5)) == 1.5 and timeout_seconds(2) == 2.0
    assert CommOptions(timeout=np.int64(3)).timeout == 3.0
    assert StandInSpec(nbytes=1 << 20, timeout_s=np.float64(0.25)).timeout_s == 0.25


def test_numpy_integers_are_taken_as_ints():
    n = np.int64
    assert occupancy.occupancy("H200", block_size=n(256), registers=np.int32(32)).blocks == 8
    assert occupancy.shape("H200", {"registers": n(32)}, n(256), resident_blocks=n(2)).resident_blocks == 2
    fp = Footprint("f", n(1), n(256), n(32), n(0), n(0))
    assert type(fp.threads) is int and fp == Footprint("f", 1, 256, 32, 0, 0)
    c = Choice("shaping", resident_blocks=n(2), dynamic_smem=np.uint32(0))
    assert c == Choice("shaping", resident_blocks=2) and type(c.resident_blocks) is int
    assert planner.candidates(PROBLEM, threads=(None, n(256)), partition_steps=n(2), partition_granularity=n(4))[0]
    opts = CommOptions(min_ctas=n(2), max_ctas=np.uint8(8), cga_cluster_size=np.int16(0))
    assert (opts.min_ctas, opts.max_ctas) == (2, 8) and type(opts.max_ctas) is int
    assert CommOptions().build(n(22809)).version == 22809
    assert StandInSpec(nbytes=n(1 << 20), ranks=n(4)).steps == 6
    assert stream_priority(n(-2), (0, -5)) == -2 and partition_sms(n(16), 132) == 16
    assert as_shape((n(2), np.uint8(3))) == (2, 3) and as_shape(n(4)) == (4,)
    assert buffer_counts("all_gather", n(4), n(2)) == (4, 8)
    KERNEL.set_carveout(n(50))
    assert KERNEL.max_active_blocks(n(128)) == 1


def test_wrong_lengths_are_refused():
    for uid in (b"", bytes(127), bytes(129), bytearray(16)):
        refused(lambda v: Communicator(None, v, 0, 1), uid, "must be the 128 bytes", shown=f"not {len(uid)} bytes")
    for dims in ((), (1, 1, 1, 1), [2, 2, 2, 2]):
        refused(lambda v: KERNEL.launch(v, 32, BUFFER), dims, "grid must be an int or a tuple of 1-3 ints")
        refused(lambda v: KERNEL.launch(1, v, BUFFER), dims, "block must be an int or a tuple of 1-3 ints")
    with pytest.raises(UsageError, match="takes 1 arguments.*got 2"):
        KERNEL.launch(1, 32, BUFFER, BUFFER)
    with pytest.raises(UsageError, match="host array must have the buffer's 64 bytes, not 60"):
        BUFFER.copy_from_host(np.zeros(15, np.float32))
    with pytest.raises(UsageError, match=r"a view must have the buffer's 64 bytes, not shape \(3,\)"):
        BUFFER.view(shape=3)
    with pytest.raises(UsageError, match="must fit the buffer's 4 bytes a whole number of times, not complex64"):
        Buffer(_Device(), 0x1000, 4, (1,), np.float32, owner=None).view(np.complex64)
    with pytest.raises(UsageError, match="stamps must be a numpy integer array of 3 words per block"):
        metrics.blocks(np.array([1, 2, 3, 4], np.uint64), 1e9, 0)
    with pytest.raises(UsageError, match="backward.. takes two lists of the same length"):
        Schedule.backward([_Work()], [_Work(), _Work()])


# --- the cases of issue 13, one by one ----------------------------------------------------------

def test_a_resources_dict_missing_a_key_names_it():
    message = refused(lambda v: occupancy.shape("H200", v, 256, resident_blocks=2), {}, "must have the key")
    assert "'registers'" in message
    with pytest.raises(UsageError, match="missing 'registers'"):
        occupancy.coresident("H200", {"static_smem": 0}, 256, NCCL_2_28_SM90)
    with pytest.raises(UsageError, match="keys must be among .*, not static_smen"):  # a typo is not read as 0
        occupancy.shape("H200", {"registers": 32, "static_smen": 4096}, 256, resident_blocks=2)
    for bad in (None, 32, "registers", [("registers", 32)]):
        refused(lambda v: occupancy.shape("H200", v, 256, resident_blocks=2), bad, "resources must be")
    with pytest.raises(UsageError, match=r"compute must be a dict with 'registers' and 'static_smem'"):
        Problem(H200, {"registers": 18}, 256, NCCL_2_28_SM90, 16)


@pytest.mark.parametrize("name", ["B200", "sm_99", "h2000", "", "gfx1100", " "])
def test_unknown_targets_list_the_known_ones(name):
    for call in (lambda v: targets.get(v), lambda v: occupancy.occupancy(v, block_size=256, registers=8),
                 lambda v: occupancy.max_active_blocks(v, block_size=256, registers=8),
                 lambda v: occupancy.coresident(v, RES, 256, NCCL_2_28_SM90),
                 lambda v: shimrt.compile(EMPTY_KERNEL, v)):
        message = refused(call, name, "target must be one of")
        assert all(known in message for known in ("A100", "A40", "H100", "H200", "MI250X", "sm_90", "gfx90a"))


def test_blocks_too_large_for_the_target_are_refused_by_shape():
    with pytest.raises(UsageError, match="a block of 2048 threads .* cannot run on H200 at all"):
        occupancy.shape("H200", RES, 2048, resident_blocks=1)
    assert occupancy.max_active_blocks("H200", block_size=2048, registers=8) == 0  # the calculator's answer
    with pytest.raises(UsageError, match="reserve must be a Footprint"):
        occupancy.shape("H200", RES, 256, reserve={"blocks": 1})


def test_a_name_of_none_and_a_source_of_none_are_usage_errors(cache_dir):
    refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", name=v), None, "name must be a string")
    refused(kernels.source, None, "kernel source name must name a source .* there are: .*vector_ops.cu")
    refused(kernels.path, 5, "kernel source name must name a source")
    refused(kernels.source, "shimrt_portable.h", "kernel source name must name a source")  # a header, not a source


def test_options_are_a_list_of_strings(cache_dir):
    for bad in ("-DX", b"-DX", None, 5, {"-DX"}, (o for o in ["-DX"])):
        refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", options=v), bad,
                r"options must be a sequence of strings \(a list or tuple\)")
    assert shimrt.compile(EMPTY_KERNEL, "sm_90", options=("-DX=1",)).resources["k"].registers >= 0


@pytest.mark.parametrize("option", ["--gpu-architecture=sm_80", "-arch=sm_80", "-arch", "--gpu-architecture",
                                    "-arch sm_80", "--offload-arch=gfx90a", "-offload-arch=gfx90a",
                                    "--cuda-gpu-arch=sm_80", "-march=gfx90a", "-mcpu=gfx908", " -arch=sm_86",
                                    "-gencode=arch=compute_80,code=sm_80", "--GPU-ARCHITECTURE=sm_80"])
@pytest.mark.parametrize("target", ["sm_90", "H200", "gfx90a"])
def test_options_that_set_the_architecture_are_refused(option, target, cache_dir):
    # Before anything compiles: a Program labelled sm_90 must never hold sm_80 code.
    message = refused(lambda v: shimrt.compile(EMPTY_KERNEL, target, options=["-DX=1", v]), option,
                      "options must not set the architecture: pass the target instead")
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
    assert "sm_80" in message or option in message


def test_options_that_only_look_alike_are_passed_on(cache_dir):
    # -DARCH=..., a macro named like an option, is not an architecture option.
    program = shimrt.compile(EMPTY_KERNEL, "sm_90", options=["-DARCH=80", "-Darch=1"])
    assert program.target.arch == "sm_90" and "-DARCH=80" in program.options


def test_a_nul_in_the_source_is_refused_not_truncated(cache_dir):
    source = EMPTY_KERNEL + "\0 this would be cut off: not_declared_anywhere;"
    message = refused(lambda v: shimrt.compile(v, "sm_90"), source, "source must be a string .*without NUL")
    assert "NUL" in message
    refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", name=v), "k\0.cu", "without NUL")
    refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", options=[v]), "-DX=1\0-arch=sm_80", "without NUL")


def test_cache_no_is_refused_and_cache_false_never_touches_the_cache(cache_dir):
    refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", cache=v), "no", "cache must be True or False")
    program = shimrt.compile(EMPTY_KERNEL, "sm_90", cache=False)
    assert not program.from_cache and not cache_dir.exists()
    shimrt.compile(EMPTY_KERNEL, "sm_90", cache=True)
    assert len(list(cache_dir.iterdir())) == 1
    assert shimrt.compile(EMPTY_KERNEL, "sm_90", cache=np.True_).from_cache


def test_one_include_dir_as_a_string_is_one_folder(cache_dir, tmp_path):
    include = tmp_path / "inc"
    include.mkdir()
    (include / "answer.h").write_text("#define ANSWER 42\n")
    source = '#include "answer.h"\nextern "C" __global__ void k(int* p) { *p = ANSWER; }'
    for given in (str(include), include, [str(include)], (include,)):
        program = shimrt.compile(source, "sm_90", include_dirs=given)
        assert program.options.count(f"-I{include.resolve()}") == 1
        # the folders the compile searches, and so the cache hashes: never "/" or one-letter folders
        assert rtc.include_search(list(program.options), program.name).folders == (str(include.resolve()),)
    assert kernels.headers(str(include)) == [include / "answer.h"]


@pytest.mark.parametrize("bad", ["/nonexistent/include", "", "a\0b", 5, None, b"/tmp", [5], ["/nonexistent"]])
def test_include_dirs_must_be_existing_folders(bad, cache_dir, tmp_path):
    if bad is None:
        return  # None is the default: kernels_src/
    item = bad[0] if isinstance(bad, list) else bad
    message = refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", include_dirs=v), bad,
                      "include dir.* must be|include_dirs must be", shown=repr(item))
    assert "folder" in message
    file = tmp_path / "file.h"
    file.write_text("")
    refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", include_dirs=[v]), str(file),
            "each include dir must be an existing folder")


def test_comm_options_validate_every_field_at_construction():
    cases = {
        "blocking": (["no", 0, 1, None, "False"], "blocking must be True or False"),
        "timeout": ([True, math.inf, math.nan, 0, -1, "5", None], "timeout must be a finite positive number"),
        "min_ctas": ([0, 65, True, 2.0, "4"], "min_ctas must be an int in 1..64"),
        "max_ctas": ([0, 65, False, 8.5, "8"], "max_ctas must be an int in 1..64"),
        "cta_policy": (["fast", "", 0, True], "cta_policy must be one of default, efficiency, zero"),
        "cga_cluster_size": ([-1, 9, True, 1.0], "cga_cluster_size must be an int in 0..8"),
        "net_name": ([123, "", "IB\0x", b"IB", True], "net_name must be a string"),
    }
    for field, (values, allowed) in cases.items():
        for value in values:
            refused(lambda v, f=field: CommOptions(**{f: v}), value, re.escape(allowed))
    refused(lambda v: CommOptions(net_name=v), "Sóckét", "net_name must be an ASCII network name")
    with pytest.raises(UsageError, match=r"min_ctas must be at most max_ctas \(2\), not 8"):
        CommOptions(min_ctas=8, max_ctas=2)
    for version in (21699, -1, "22809", 22809.0, None, True, 2**40):
        refused(lambda v: CommOptions().build(v), version, "NCCL version|predates")
    cfg = CommOptions(blocking=True, timeout=5, min_ctas=2, max_ctas=8, cta_policy="zero", cga_cluster_size=0,
                      net_name="Socket").build(22809)
    assert (cfg.blocking, cfg.minCTAs, cfg.maxCTAs, cfg.CTAPolicy, cfg.netName) == (1, 2, 8, 2, b"Socket")


def test_shimrt_nccl_library_is_the_only_place_searched(monkeypatch):
    monkeypatch.setenv("SHIMRT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    loader = library.Loader()  # a fresh process: nothing loaded before
    assert library.candidates("cuda") == library.candidates("hip") == ["/nonexistent/libnccl.so.2"]
    for backend in ("cuda", "hip"):
        with pytest.raises(CollectiveError) as info:
            loader.load(backend)
        message = str(info.value)
        assert "SHIMRT_NCCL_LIBRARY" in message and "/nonexistent/libnccl.so.2" in message
        assert "No such file or directory" in message  # the loader's own reason
    assert loader.loaded == {}  # it did not fall back to the wheel's (or the system's) NCCL


def test_a_library_that_is_not_nccl_is_refused_naming_the_variable(monkeypatch):
    import ctypes.util
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library to point at")
    monkeypatch.setenv("SHIMRT_NCCL_LIBRARY", libc)
    with pytest.raises(CollectiveError, match="SHIMRT_NCCL_LIBRARY=.*not an NCCL or RCCL library"):
        library.Loader().load("cuda")  # a fresh process's: nothing loaded before


def test_a_compute_spec_larger_than_the_host_is_refused_before_allocating():
    available = workloads.available_host_memory()
    assert available is not None and available > 0  # Linux reports it
    n = math.isqrt(available // 4) + 1  # its float32 inputs alone exceed what is available
    spec = ComputeSpec("softmax", n)
    message = refused(workloads.inputs, spec, "must fit in host memory", shown=spec.label)
    assert f"needs {workloads.host_bytes(spec)} bytes" in message and "available" in message
    assert "softmax-" in message
    # The case of the issue, whatever this machine has: 74.5 GiB of float64 draws for softmax-100000.
    assert workloads.host_bytes(ComputeSpec("softmax", 100_000)) > 8 * 100_000**2


def test_memory_checks_name_both_sizes(monkeypatch):
    monkeypatch.setattr(specs, "available_host_memory", lambda: 1000)
    spec = ComputeSpec("sgemm", 128)
    with pytest.raises(UsageError, match=rf"the inputs of sgemm-128 must fit in host memory: it needs "
                                         rf"{workloads.host_bytes(spec)} bytes .* and 1000 bytes .* are available"):
        workloads.inputs(spec)
    with pytest.raises(UsageError, match="the float64 reference of sgemm-128 must fit in host memory"):
        workloads.expected(spec, {"A": np.zeros((128, 128), np.float32), "B": np.zeros((128, 128), np.float32)})
    monkeypatch.setattr(specs, "available_host_memory", lambda: None)  # unknown: not refused
    assert set(workloads.inputs(ComputeSpec("softmax", 8))) == {"x"}
    assert workloads.device_bytes(spec) == 4 * 3 * 128 * 128


def test_compute_spec_sizes_follow_the_kernels_grids():
    assert ComputeSpec("sgemm", 65535 * 128).size == 65535 * 128  # the y grid limit, in 128-row tiles
    with pytest.raises(UsageError, match="size must be a positive int .at most 8388480 for sgemm.*8388608"):
        ComputeSpec("sgemm", 65536 * 128)
    assert ComputeSpec("softmax", 2**31 - 1).size == 2**31 - 1  # one block per row; 64-bit indexing


def test_workload_arguments_belong_to_their_kind():
    with pytest.raises(UsageError, match="beta is for sgemm, not softmax"):
        workloads.inputs(SOFTMAX, beta=0.5)
    with pytest.raises(UsageError, match="alpha and beta are for sgemm, not softmax"):
        workloads.expected(SOFTMAX, SOFTMAX_HOST, alpha=2.0)
    with pytest.raises(UsageError, match="host must hold the inputs x of softmax-4, not x, y"):
        workloads.expected(SOFTMAX, {**SOFTMAX_HOST, "y": SOFTMAX_HOST["x"]})
    for bad in (None, "sgemm-128", ("sgemm", 128)):
        refused(workloads.inputs, bad, "spec must be a ComputeSpec")
        refused(workloads.tolerance, bad, "spec must be a ComputeSpec")
    ref, scale = workloads.expected(SOFTMAX, SOFTMAX_HOST)
    with pytest.raises(UsageError, match="out must be a numpy array of real numbers"):
        workloads.compare(SOFTMAX, [[0.0] * 4] * 4, ref, scale)


def test_planner_candidates_refuse_bad_sweeps():
    for bad in ((), [], None, 5, "256"):
        refused(lambda v: planner.candidates(PROBLEM, threads=v), bad, "threads must be a non-empty list")
        refused(lambda v: planner.candidates(PROBLEM, blocks=v), bad, "blocks must be a non-empty list")
    refused(lambda v: planner.candidates(PROBLEM, partition_granularity=v), 0, "partition_granularity")
    refused(lambda v: planner.candidates(v), "problem", "problem must be a planner.Problem")
    refused(lambda v: planner.estimate(PROBLEM, 1.0, v), math.inf, "t_comm")
    feasible, rejected = planner.candidates(PROBLEM, threads=(None, 256, 256))
    assert len(feasible) == len(set(feasible))


def test_choices_from_dicts_refuse_what_they_do_not_know():
    c = Choice("partition", partition_sms=16, comm_priority="high")
    assert Choice.from_dict(c.as_dict()) == c
    with pytest.raises(UsageError, match="Choice keys must be among .*, not speed"):
        Choice.from_dict({**c.as_dict(), "speed": 3})
    for bad in (None, [], "partition", {}):
        with pytest.raises(UsageError, match="Choice"):
            Choice.from_dict(bad)


def test_schedules_and_engines_check_what_they_take():
    refused(lambda v: Schedule(v), None, "ops must be a list of Op")
    with pytest.raises(UsageError, match="op 0 must be an Op"):
        Schedule([_Work(), Op("comm", _Work())])
    refused(lambda v: Op("compute", v), None, "op work must be")
    refused(lambda v: Engine(None, v), "schedule", "schedule must be a Schedule")
    refused(lambda v: Engine(v, SCHEDULE), "cuda:0", "device must be a shimrt Device")


def test_device_helpers_refuse_bad_values():
    for bad in (None, "3", 2.5, [2, -1], [2, 2.0], {2: 1}, {2}, [True], b"\x02"):
        refused(as_shape, bad, "shape must be an int or a sequence of ints, each >= 0")
    for bad in (None, "floatx", object, np.float64(1.0), "O", "U8", "V4", "(3,)f4", 4, True, "", dict):
        refused(as_dtype, bad, "dtype must be a numeric numpy dtype")
    assert as_dtype("int64") == np.int64 and as_dtype(np.float32) == np.float32 and as_dtype("?") == np.bool_
    for bad in (None, "abc", 5, 2.5, True, [object()], np.array([{}]), [[1, 2], [3]]):
        refused(host_array, bad, "array must be a host array of numbers")
    assert host_array([1, 2]).tolist() == [1, 2]
    for bad in ("highest", "HIGH", 1, -6, 0.0, None, True):
        refused(lambda v: stream_priority(v, (0, -5)), bad, r"stream priority must be 'high', 'low' or an int in -5..0")
    assert (stream_priority("high", (0, -5)), stream_priority("low", (0, -5))) == (-5, 0)


@pytest.mark.parametrize("index", [True, False, -1, 1.0, "0", None, np.bool_(False)])
def test_device_indices_are_non_negative_ints(index):
    refused(Device, index, "device index must be an int in 0..2147483647")


def test_a_numpy_device_index_is_taken():
    try:
        dev = Device(np.int64(0))
    except shimrt.NoDeviceError:
        return  # no GPU here: refused for that, not for the index
    assert dev.index == 0 and type(dev.index) is int


def test_buffers_refuse_bad_views_slices_and_copies():
    buf2 = Buffer(_Device(), 0x1000, 64, (4, 4), np.float32, owner=None)
    for bad in (3, slice(1.5, 3), slice("a", None), slice(0, 8, 2), slice(True, 4), (slice(0, 2),), "0", None):
        refused(lambda v: BUFFER[v], bad, "a buffer index must be a slice")
    refused(lambda v: buf2[v], slice(0, 2), "a buffer index must be a slice of a one-dimensional buffer")
    assert BUFFER[np.int64(2):np.int64(6)].shape == (4,) and BUFFER[-4:].shape == (4,)
    for bad in ("", 0, "floatx", object, np.float32(1)):
        refused(lambda v: BUFFER.view(v), bad, "dtype must be a numeric numpy dtype")
    assert BUFFER.view(np.uint8).shape == (64,) and BUFFER.view(shape=(2, 8)).shape == (2, 8)
    for bad in (None, [1.0] * 16, np.zeros(16, object), np.zeros(32, np.float32)[::2], BUFFER):
        with pytest.raises(UsageError, match="host array must be"):
            BUFFER.copy_from_host(bad)
    readonly = np.zeros(16, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(UsageError, match="host array must be writable"):
        BUFFER.copy_to_host(readonly)
    refused(BUFFER.copy_from, "buffer", "copy_from.. takes a shimrt Buffer")


def test_kernels_refuse_bad_launches_before_the_driver():
    for bad in (1.0, True, 0, -1, "1", None, (1, 0), (1, 65536), 2**31, (1, True)):
        refused(lambda v: KERNEL.launch(v, 32, BUFFER), bad, "grid must be (an int|positive|at most)")
    for bad in (1.0, True, 0, 2048, (32, 1, 65), (2000, 1), None, (1, 1025)):
        refused(lambda v: KERNEL.launch(1, v, BUFFER), bad, "block must (be|have)")
    with pytest.raises(UsageError, match="a block of 512 threads exceeds its limit of 256"):
        KERNEL.launch(1, (256, 2), BUFFER)
    refused(lambda v: KERNEL.launch(1, 32, BUFFER, dynamic_smem=v), True, "dynamic_smem must be an int >= 0")
    with pytest.raises(UsageError, match="exceeds the device's 232448 B per block"):
        KERNEL.launch(1, 32, BUFFER, dynamic_smem=HUGE)
    refused(lambda v: KERNEL.shape(256, reserve=v), "NCCL", "reserve must be a Footprint")


def test_modules_refuse_bad_kernel_names():
    from shimrt.kernel import Module
    module = Module(_Device(), "handle", PROGRAM)
    for bad in (None, 5, ["k"], "", "k\0", b"k"):
        refused(lambda v: module[v], bad, "kernel name must be one of k")
    assert ["k"] not in module and "k" in module and None not in module


def test_streams_and_events_take_events_and_streams():
    refused(STREAM.record, "event", "record.. takes a shimrt Event or None")
    refused(STREAM.wait, None, "wait.. takes a shimrt Event")
    refused(EVENT.elapsed_ms, 1.0, "elapsed_ms.. takes a shimrt Event")


def test_communicators_check_everything_before_loading_nccl(monkeypatch):
    def no_load(*args):
        raise AssertionError("the library was loaded before the arguments were checked")
    monkeypatch.setattr(library, "load", no_load)
    refused(lambda v: Communicator(None, bytes(128), v, 2), 2, r"rank must be an int in 0..1")
    refused(lambda v: Communicator(None, bytes(128), 0, v), 0, r"size must be an int in 1..")
    refused(lambda v: Communicator(None, v, 0, 1), "00" * 128, "unique_id must be the 128 bytes")
    refused(lambda v: Communicator(None, v, 0, 1), bytes(127), "unique_id must be the 128 bytes", shown="127 bytes")
    refused(lambda v: Communicator(None, bytes(128), 0, 1, options=v), {"timeout": 5}, "options must be a CommOptions")
    refused(lambda v: Communicator(v, bytes(128), 0, 1), "cuda:0", "device must be a shimrt Device")
    refused(lambda v: Communicator.local(v), [], "devices must be a non-empty list of shimrt Devices")
    refused(lambda v: Communicator.local(v), ["cuda:0"], "devices must be a non-empty list of shimrt Devices")
    from shimrt.nccl import unique_id
    refused(lambda v: unique_id(v), "libnccl.so", "lib must be a shimrt.nccl.library.Library")


def test_kernel_resources_and_programs_are_checked():
    with pytest.raises(UsageError, match="KernelResources.from_dict needs .*missing max_threads_per_block"):
        KernelResources.from_dict({"registers": 1, "static_smem": 0, "local_bytes": 0, "spill_bytes": 0})
    refused(lambda v: KernelResources(8, 0, 0, 0, 256, extra=v), [], "extra must be a dict")
    program = shimrt.compile(EMPTY_KERNEL, "sm_90")
    for field, bad in (("binary", b""), ("binary", "ELF"), ("target", "sm_90"), ("resources", {"k": {}}),
                       ("name", ""), ("options", ["-DX"]), ("log", None)):
        with pytest.raises(UsageError, match=f"Program.{field} must be"):
            type(program)(**{**program.__dict__, field: bad})
    with pytest.raises(UsageError, match="Target has no field speed"):
        H200.with_(speed=3)
    with pytest.raises(UsageError, match="Target.sgpr_alloc_unit must be an int >= 1 when sgprs_per_simd is set"):
        targets.get("MI250X").with_(sgpr_alloc_unit=0)


# --- the cases of issue 24 ----------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda v: validate.number(v, "x"), lambda v: CommOptions(timeout=v), lambda v: planner.estimate(PROBLEM, v, 1.0),
    lambda v: metrics.compute(1.0, 1.0, 2.0, v, 1.0, 0.0), lambda v: StandInSpec(1 << 20, link_gbps=v)])
@pytest.mark.parametrize("value", [10**400, -10**400, 10**5000], ids=["1e400", "-1e400", "1e5000"])
def test_ints_beyond_any_float_are_refused_not_overflowed(call, value):
    """float(10**400) raises OverflowError: the check refuses the value instead, and names it even
    where Python will not print it (more than 4300 digits)."""
    with pytest.raises(UsageError, match=r"must be a finite (positive )?number.*, not (-?10000000|an int of about)"):
        call(value)


def test_ints_too_long_to_print_are_named_by_their_size():
    with pytest.raises(UsageError, match=r"^x must be an int <= 5, not an int of about 5001 digits$"):
        validate.integer(10**5000, "x", most=5)
    with pytest.raises(UsageError, match=r"^x must be an int >= 0, not an int of about 5001 digits$"):
        validate.integer(-10**5000, "x", least=0)
    assert validate.shown("y" * 1000) == repr("y" * 1000)[:200] + "..."


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "k\ud83d.cu"])
def test_lone_surrogates_are_refused_where_text_is_written_out(text, cache_dir):
    """A lone surrogate cannot be encoded for NVRTC, hipRTC or NCCL: UsageError naming it, where
    compile() used to raise UnicodeEncodeError from the compiler's binding."""
    allowed = "without NUL characters or lone surrogates"
    refused(lambda v: validate.text(v, "x"), text, allowed)
    refused(lambda v: shimrt.compile(EMPTY_KERNEL + "// " + v, "sm_90"), text, f"source must be .*{allowed}",
            shown=repr(text)[1:-1])
    refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", name=v), text, f"name must be .*{allowed}")
    refused(lambda v: shimrt.compile(EMPTY_KERNEL, "sm_90", options=[f"-DX={v}"]), text, "each option must be",
            shown=repr(text)[1:-1])
    refused(lambda v: CommOptions(net_name=v), text, f"net_name must be .*{allowed}")
    refused(lambda v: Footprint(v, 1, 256, 32, 0, 0), text, f"Footprint.name must be .*{allowed}")


def test_paths_take_what_the_os_decoded_but_not_lone_surrogates(tmp_path):
    # Undecodable bytes in a file name come back as U+DC80..U+DCFF (surrogateescape): a real path.
    name = os.fsdecode(b"results-\xff.json")
    assert validate.writable_file(str(tmp_path / name), "--json") == tmp_path / name
    refused(lambda v: validate.writable_file(v, "--json"), str(tmp_path / "out\ud800.json"), "--json must be")
    refused(lambda v: validate.readable_file(v, "script"), "in\ud800.py", "script must be")


@pytest.mark.parametrize("value", ["\u0661\u0662", "1" * 5000, "1" * 31 + "K"], ids=["arabic", "5000", "31K"])
def test_byte_counts_are_ascii_digits_of_reasonable_length(value):
    refused(lambda v: validate.nbytes(v, "x"), value, "x must be a byte count such as 8, 64K, 256M or 1G",
            shown=validate.shown(value))


@pytest.mark.parametrize("value", [np.array([1, 2]), ["sum"], {"sum": 0}, {}])
def test_one_of_refuses_arrays_and_unhashables_instead_of_raising(value):
    refused(lambda v: validate.one_of(v, "op", ("sum", "max")), value, "op must be one of sum, max",
            shown=validate.shown(value))
    refused(lambda v: CommOptions(cta_policy=v), value, "cta_policy must be one of", shown=validate.shown(value))
    refused(lambda v: library_ops(v), value, "op must be one of sum", shown=validate.shown(value))
    assert validate.one_of(np.str_("sum"), "op", ("sum", "max")) == "sum"


def library_ops(op):
    from shimrt.nccl import collectives
    return collectives.op_of("all_reduce", collectives.COLLECTIVES["all_reduce"], op)


def test_values_beyond_what_any_gpu_or_c_int_takes_are_refused():
    """Values that reach a C int (ranks, grids, ordinals), an unsigned int (dynamic shared
    memory) or a GPU's own limits (SMs, threads per block) are refused where they enter."""
    from shimrt.overlap.standin import StandInSpec as Spec
    from shimrt.targets import MAX_BLOCK_THREADS, MAX_SMS
    cases = [
        (lambda v: Choice("partition", partition_sms=v), MAX_SMS + 1, f"partition_sms .*in 1..{MAX_SMS}"),
        (lambda v: Choice("priority", comm_threads=v), MAX_BLOCK_THREADS + 1, f"comm_threads .*1..{MAX_BLOCK_THREADS}"),
        (lambda v: Choice("priority", comm_blocks=v), 2**31, "comm_blocks .*1..2147483647"),
        (lambda v: Choice("shaping", resident_blocks=1, dynamic_smem=v), 2**32, "dynamic_smem must be an int in "
                                                                               "0..4294967295"),
        (lambda v: Problem(H200, RES, 256, NCCL_2_28_SM90, v), 2**31, "comm_blocks must be an int in 1..2147483647"),
        (lambda v: Spec(1 << 20, dynamic_smem=v), 2**32, "dynamic_smem .*0..4294967295"),
        (lambda v: Spec(1 << 20, link_gbps=v), 1e308, r"link_gbps .*finite positive number in 0.001..1000000.0"),
        (lambda v: Spec(1 << 20, link_gbps=v), 1e-300, r"link_gbps .*finite positive number in 0.001..1000000.0"),
        (lambda v: H200.with_(num_sms=v), 2**31, "Target.num_sms must be an int in 1..2147483647"),
        (lambda v: planner.estimate(PROBLEM, v, v), 1e308, r"t_comp \(ms\) must be a finite positive number <= "),
        (lambda v: buffer_counts("all_reduce", v, 2), 2**64, "count must be an int in 0..18446744073709551615"),
        (lambda v: buffer_counts("all_reduce", 8, v), 2**31, "size must be an int in 1..2147483647"),
        (lambda v: Device(v), 2**31, "device index must be an int in 0..2147483647"),
    ]
    for call, value, allowed in cases:
        refused(call, value, allowed)
