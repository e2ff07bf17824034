"""Every grid and block form the launch fast path takes, on a real GPU: each thread writes where it
ran, and every element is checked against numpy; numpy scalars of every size land bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

SOURCE = r"""
// Each thread writes its block and thread index and the grid and block dims (12 words) at its
// place in launch order: block after block (x fastest), thread after thread within a block.
extern "C" __global__ void where(unsigned int* out, unsigned long long capacity) {
    unsigned long long block = blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned long long i = block * (blockDim.x * blockDim.y * blockDim.z) + thread;
    if (i >= capacity) return;
    unsigned int* r = out + i * 12;
    r[0] = blockIdx.x; r[1] = blockIdx.y; r[2] = blockIdx.z;
    r[3] = threadIdx.x; r[4] = threadIdx.y; r[5] = threadIdx.z;
    r[6] = gridDim.x; r[7] = gridDim.y; r[8] = gridDim.z;
    r[9] = blockDim.x; r[10] = blockDim.y; r[11] = blockDim.z;
}

// The bits of one scalar parameter of each size and kind, zero-extended to 64 bits.
extern "C" __global__ void scalars(unsigned long long* out, signed char i8, unsigned char u8, short i16,
                                   unsigned short u16, int i32, unsigned int u32, float f32, long long i64,
                                   unsigned long long u64, double f64) {
    out[0] = (unsigned char)i8; out[1] = u8; out[2] = (unsigned short)i16; out[3] = u16;
    out[4] = (unsigned int)i32; out[5] = u32; out[6] = __float_as_uint(f32);
    out[7] = (unsigned long long)i64; out[8] = u64; out[9] = (unsigned long long)__double_as_longlong(f64);
}
"""


@pytest.fixture(scope="module")
def forms(device):
    return device.load(device.compile(SOURCE, name="grid_forms.cu"))


def _expected(grid: tuple, block: tuple) -> np.ndarray:
    """What ``where`` writes for a launch of ``grid`` x ``block`` (both (x, y, z)), row by row."""
    blocks = np.indices(grid[::-1]).reshape(3, -1)[::-1].T  # (x, y, z) per block, x fastest
    threads = np.indices(block[::-1]).reshape(3, -1)[::-1].T
    rows = np.empty((len(blocks) * len(threads), 12), np.uint32)
    rows[:, 0:3] = np.repeat(blocks, len(threads), axis=0)
    rows[:, 3:6] = np.tile(threads, (len(blocks), 1))
    rows[:, 6:9] = grid
    rows[:, 9:12] = block
    return rows


# (grid, block) as the caller writes them -> the (x, y, z) dims they stand for.
FORMS = [
    (3, 64, (3, 1, 1), (64, 1, 1)),
    ((3,), (64,), (3, 1, 1), (64, 1, 1)),
    ([3], [64], (3, 1, 1), (64, 1, 1)),
    ((3, 1, 1), (64, 1, 1), (3, 1, 1), (64, 1, 1)),
    (np.int64(3), np.int32(64), (3, 1, 1), (64, 1, 1)),
    ((3, 2), (16, 4), (3, 2, 1), (16, 4, 1)),
    ((3, 2, 2), (8, 4, 2), (3, 2, 2), (8, 4, 2)),
    ([3, 2, 2], [8, 4, 2], (3, 2, 2), (8, 4, 2)),
    ((np.int64(3), 2, np.uint32(2)), [np.int16(8), 4, np.uint8(2)], (3, 2, 2), (8, 4, 2)),
    (5, (8, 8, 4), (5, 1, 1), (8, 8, 4)),
    ((5, 6, 7), 32, (5, 6, 7), (32, 1, 1)),
    ((2, 3, 4), (4, 2, 8), (2, 3, 4), (4, 2, 8)),
    ([np.uint16(2)], (32, 32), (2, 1, 1), (32, 32, 1)),
    ((70000,), (1,), (70000, 1, 1), (1, 1, 1)),          # x beyond 65535, which only x may be
    ((1, 65535), 2, (1, 65535, 1), (2, 1, 1)),
    ((1, 1, 65535), (1, 1, 2), (1, 1, 65535), (1, 1, 2)),
]


@pytest.mark.parametrize("grid,block,gdims,bdims", FORMS, ids=[f"{f[0]!r}x{f[1]!r}" for f in FORMS])
def test_every_form_runs_with_its_dims(device, forms, grid, block, gdims, bdims):
    want = _expected(gdims, bdims)
    spare = 256  # rows past the launch's threads, which must stay untouched
    out = device.empty((len(want) + spare, 12), np.uint32).memset(0xFF)
    forms["where"].launch(grid, block, out, len(want) + spare)
    got = out.numpy()
    np.testing.assert_array_equal(got[:len(want)], want)
    assert (got[len(want):] == 0xFFFFFFFF).all()


def test_forms_on_a_stream_and_with_numpy_arguments(device, forms):
    want = _expected((3, 2, 2), (8, 4, 2))
    out = device.empty(want.shape, np.uint32).memset(0xFF)
    device.synchronize()  # the memset ran on the default stream
    with device.stream("high") as s:
        forms["where"].launch([3, 2, 2], (8, 4, 2), out, np.uint64(len(want)), stream=s)
        s.synchronize()
        np.testing.assert_array_equal(out.numpy(s), want)


def _nan32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


def _nan64(bits: int) -> np.float64:
    return np.array([bits], np.uint64).view(np.float64)[0]


SCALARS = [
    (np.int8(-128), np.uint8(255), np.int16(-2**15), np.uint16(65535), np.int32(-2**31), np.uint32(2**32 - 1),
     np.float32(-0.0), np.int64(-2**63), np.uint64(2**64 - 1), np.float64(-1e-300)),
    (np.int8(127), np.uint8(0), np.int16(2**15 - 1), np.uint16(1), np.int32(2**31 - 1), np.uint32(0),
     np.float32(3.4e38), np.int64(2**63 - 1), np.uint64(2**63), np.float64(np.pi)),
    (np.int8(-1), np.uint8(1), np.int16(-1), np.uint16(0), np.intc(-7), np.uintc(7),
     _nan32(0x7F800001), np.longlong(-9), np.ulonglong(9), _nan64(0x7FF0000000000001)),  # signalling NaNs
    (np.int8(5), np.uint8(6), np.int16(7), np.uint16(8), np.int32(9), np.uint32(10),
     _nan32(0xFFC00123), np.int64(11), np.uint64(12), _nan64(0xFFF8000000000123)),
]


@pytest.mark.parametrize("values", SCALARS, ids=range(len(SCALARS)))
@pytest.mark.parametrize("grid", [1, (1,), [1], np.int64(1)], ids=repr)
def test_numpy_scalars_of_every_size_land_bit_for_bit(device, forms, values, grid):
    out = device.empty(10, np.uint64).memset(0xAB)
    forms["scalars"].launch(grid, (1, 1, 1), out, *values)
    want = np.array([int.from_bytes(v.tobytes(), "little") for v in values], np.uint64)
    np.testing.assert_array_equal(out.numpy(), want)


def test_python_scalars_take_each_parameters_size(device, forms):
    out = device.empty(10, np.uint64).memset(0xAB)
    forms["scalars"].launch((1,), [1], out, -3, 250, -300, 60000, -2**31, 2**32 - 1, 1.5, -2**63, 2**64 - 1, 0.1)
    want = [0xFD, 250, 2**16 - 300, 60000, 2**31, 2**32 - 1, int(np.float32(1.5).view(np.uint32)),
            2**63, 2**64 - 1, int(np.float64(0.1).view(np.uint64))]
    np.testing.assert_array_equal(out.numpy(), np.array(want, np.uint64))
