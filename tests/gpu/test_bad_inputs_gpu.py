"""The checks of tests/test_bad_inputs.py on a real device: a Device's methods, its streams, events,
buffers and kernels, workloads too large for the device, and communicators refuse bad input with a
UsageError naming the value and what is allowed, before anything reaches the driver."""

from __future__ import annotations

import math

import numpy as np
import pytest

import shimrt
from shimrt import UsageError, kernels
from shimrt.occupancy import NCCL_2_28_SM90


def refused(call, value, allowed: str):
    with pytest.raises(UsageError, match=allowed) as info:
        call(value)
    message = str(info.value)
    named = repr(value)[:100] if not isinstance(value, (bool, int, float, np.generic)) else str(value)
    assert named in message or repr(value) in message, message
    return message


@pytest.fixture(scope="module")
def saxpy(device):
    module = device.load(device.compile(kernels.source("vector_ops"), name="vector_ops.cu"))
    return module["saxpy"]


@pytest.mark.parametrize("index", [True, False, -1, 1.5, "0", None])
def test_device_index_is_a_non_negative_int(device, index):
    refused(shimrt.Device, index, "device index must be an int in 0..2147483647")
    assert shimrt.Device(np.int64(device.index)).index == device.index


@pytest.mark.parametrize("timeout", [True, math.inf, math.nan, 0, -1, "5", 1e300])
def test_every_wait_takes_a_positive_finite_timeout(device, timeout):
    with device.stream() as s:
        event = s.record()
        for call in (device.synchronize, s.synchronize, event.synchronize):
            refused(call, timeout, "timeout must be a finite positive number")
        event.close()
    device.synchronize(np.float64(5))


@pytest.mark.parametrize("priority", ["highest", 1.0, True, None, 10_000, -10_000])
def test_stream_priorities(device, priority):
    refused(device.stream, priority, "stream priority must be 'high', 'low' or an int in")


def test_events_take_a_boolean_timing(device):
    for bad in ("no", 0, 1, None):
        refused(device.event, bad, "timing must be True or False")
    device.event(np.False_).close()


@pytest.mark.parametrize("shape", [-1, (2, -3), 2.0, "4", None, (2, True), {3}])
def test_empty_refuses_bad_shapes(device, shape):
    refused(lambda v: device.empty(v, np.float32), shape, "shape must be an int or a sequence of ints")


@pytest.mark.parametrize("dtype", [None, "floatx", object, "U4", np.float32(1), 5, "O"])
def test_empty_refuses_bad_dtypes(device, dtype):
    refused(lambda v: device.empty(4, v), dtype, "dtype must be a numeric numpy dtype")


def test_too_large_allocations_are_refused_before_the_driver(device):
    for shape in ((1 << 40, 1 << 40), device.total_memory + 1, 2**70):
        with pytest.raises(UsageError, match=f"an array must fit in the {device.total_memory} bytes .*: it needs "):
            device.empty(shape, np.uint8)
    for bad in (-1, True, 1.5, "1K"):
        refused(device.alloc, bad, "nbytes must be an int >= 0")
    for bad in (None, 5, "abc", [object()]):
        with pytest.raises(UsageError, match="array must be a host array of numbers"):
            device.to_device(bad)


def test_partitions_take_a_count_that_leaves_both_sides_some(device):
    n = device.target.num_sms
    for bad in (0, n, -1, True, 1.5, "8", None):
        refused(device.partition, bad, f"sms must be an int in 1..{n - 1}")


def test_buffers(device):
    buf = device.empty(16, np.float32)
    for bad in (3, slice(0, 8, 2), slice(1.5, 3), "0"):
        refused(lambda v: buf[v], bad, "a buffer index must be a slice")
    for bad in (-1, 256, True, 1.5):
        refused(buf.memset, bad, "memset value must be an int in 0..255")
    refused(buf.view, "floatx", "dtype must be a numeric numpy dtype")
    with pytest.raises(UsageError, match="host array must be a numpy array of numbers"):
        buf.copy_from_host(np.zeros(16, object))
    buf.free()


def test_launches_refuse_bad_grids_blocks_and_padding(device, saxpy):
    out = device.empty(64, np.float32).memset(0)
    for bad in (True, 0, -1, 1.5, 2**31, (1, 65536), (1, 1, 1, 1)):
        refused(lambda v: saxpy.launch(v, 32, out, out, 1.0, 64), bad, "grid must be (an int|positive|at most)")
    for bad in (True, 0, 1.5, 4096, (32, 1, 65)):
        refused(lambda v: saxpy.launch(1, v, out, out, 1.0, 64), bad, "block must (be|have)")
    refused(lambda v: saxpy.launch(1, 32, out, out, 1.0, 64, dynamic_smem=v), True, "dynamic_smem must be an int")
    with pytest.raises(UsageError, match="dynamic_smem must be an int of at most"):
        saxpy.launch(1, 32, out, out, 1.0, 64, dynamic_smem=1 << 30)
    limit = saxpy.attributes["max_threads_per_block"]
    for bad in (0, limit + 1, True, 1.5):
        refused(saxpy.max_active_blocks, bad, "block_size of kernel saxpy must be an int")
        refused(lambda v: saxpy.shape(v, resident_blocks=1), bad, "block_size of kernel saxpy must be an int")
    refused(lambda v: saxpy.shape(256, resident_blocks=v), 0, "resident_blocks must be an int")
    refused(lambda v: saxpy.shape(256, reserve=v), "NCCL", "reserve must be a Footprint")
    assert saxpy.shape(256, reserve=NCCL_2_28_SM90.with_threads(256)).resident_blocks >= 1
    refused(saxpy.set_carveout, 101, "carveout percent")
    refused(lambda v: saxpy.module[v], "saxpy\0junk", "kernel name must be one of")
    device.synchronize(30)


def test_workloads_too_large_for_the_device_are_refused_before_allocating(device):
    from shimrt.overlap import workloads
    from shimrt.overlap.workloads import ComputeSpec, ComputeWorkload
    free, _ = device.mem_info()
    n = math.isqrt(free // 8) + 1  # its input and output alone exceed the free memory
    spec = ComputeSpec("softmax", n)
    with pytest.raises(UsageError, match=rf"the buffers of softmax-{n} must fit in .* free device memory: it needs "
                                         rf"{workloads.device_bytes(spec)} bytes"):
        ComputeWorkload(device, spec)
    for bad in (-1, True, 1.5, None):
        refused(lambda v: ComputeWorkload(device, ComputeSpec("softmax", 16), seed=v), bad, "seed must be an int")
    for bad in (math.nan, math.inf, True, "2", 1e39):
        refused(lambda v: ComputeWorkload(device, ComputeSpec("sgemm", 128), alpha=v), bad, "alpha must be")


def test_communicators_refuse_bad_ranks_ids_and_timeouts(device):
    nccl = pytest.importorskip("shimrt.nccl")
    try:
        uid = nccl.unique_id(backend=device.backend)
    except shimrt.CollectiveError as exc:
        pytest.skip(f"no NCCL: {exc}")
    for rank, size in ((1, 1), (-1, 1), (True, 2), (0, 0), (0, True), (0, 2.0), (np.int64(2), 2)):
        with pytest.raises(UsageError, match="(rank|size) must be an int"):
            nccl.Communicator(device, uid, rank, size)
    for bad in (uid[:-1], uid + b"\0", uid.hex(), None):
        with pytest.raises(UsageError, match="unique_id must be the 128 bytes"):
            nccl.Communicator(device, bad, 0, 1)
    with nccl.Communicator(device, uid, np.int32(0), np.int64(1), options=nccl.CommOptions(timeout=30)) as comm:
        for bad in (True, math.inf, math.nan, 0, -1, "5"):
            refused(lambda v: comm.wait(timeout=v), bad, "timeout must be a finite positive number")
        comm.wait(timeout=np.float32(30))
