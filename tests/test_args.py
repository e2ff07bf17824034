"""Kernel argument encoding and packing (the rule documented in shimrt.args)."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from shimrt import UsageError
from shimrt.args import Packer, encode, pointer_of


class CudaArrayLike:
    """Any object that exposes __cuda_array_interface__ (as torch and CuPy arrays do)."""

    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (ptr, False), "version": 3}


@pytest.mark.parametrize("value,size,expected", [
    (7, 4, struct.pack("<i", 7)), (-7, 4, struct.pack("<i", -7)), (2**32 - 1, 4, struct.pack("<I", 2**32 - 1)),
    (-(2**63), 8, struct.pack("<q", -(2**63))), (2**64 - 1, 8, struct.pack("<Q", 2**64 - 1)),
    (5, 2, struct.pack("<h", 5)), (True, 1, b"\x01"),
    (1.5, 4, struct.pack("<f", 1.5)), (0.1, 8, struct.pack("<d", 0.1)),
    (np.float32(2.5), 4, struct.pack("<f", 2.5)), (np.int64(-3), 8, struct.pack("<q", -3)),
    (np.uint16(9), 2, struct.pack("<H", 9)), (ctypes.c_double(0.25), 8, struct.pack("<d", 0.25)),
])
def test_scalars_take_the_parameter_size(value, size, expected):
    assert encode(0, value, size) == expected


def test_pointers_come_from_array_interfaces():
    assert encode(0, CudaArrayLike(0xDEAD0000), 8) == struct.pack("<Q", 0xDEAD0000)
    assert pointer_of(CudaArrayLike(1234)) == 1234
    assert pointer_of(np.zeros(3)) is None  # a host array (its DLPack device is the CPU)


@pytest.mark.parametrize("value,size,message", [
    (2**40, 4, "does not fit"), (2**64, 8, "does not fit"), (1.0, 2, "cannot fill"),
    (np.float64(1), 4, "is 8 bytes but"), (np.zeros(4, np.float32), 8, "lives on the host"),
    ("text", 8, "cannot pass str"), (object(), 8, "cannot pass object"),
    (CudaArrayLike(16), 4, "a device pointer is 8 bytes"),
])
def test_wrong_values_are_usage_errors(value, size, message):
    with pytest.raises(UsageError, match=message):
        encode(3, value, size)


def test_packer_places_each_argument_at_its_offset():
    layout = [(0, 8), (8, 4), (12, 4), (16, 8), (24, 1)]
    packer = Packer("k", layout)
    address = packer.pack((CudaArrayLike(0x1000), 3.0, -2, 2**40, 255 - 256))
    pointers = (ctypes.c_void_p * 5).from_address(address)

    def read(i, fmt):
        return struct.unpack("<" + fmt, ctypes.string_at(pointers[i], struct.calcsize(fmt)))[0]
    assert [read(0, "Q"), read(1, "f"), read(2, "i"), read(3, "q"), read(4, "b")] == [0x1000, 3.0, -2, 2**40, -1]
    with pytest.raises(UsageError, match="takes 5 arguments"):
        packer.pack((1, 2))


def test_without_a_layout_plain_numbers_are_refused():
    packer = Packer("k", None)
    address = packer.pack((CudaArrayLike(0x2000), np.int32(5), np.float64(2.0)))
    pointers = (ctypes.c_void_p * 3).from_address(address)
    assert pointers[1] - pointers[0] == 8 and pointers[2] - pointers[0] == 16  # natural alignment
    assert struct.unpack("<i", ctypes.string_at(pointers[1], 4))[0] == 5
    with pytest.raises(UsageError, match="pass numpy scalars"):
        packer.pack((CudaArrayLike(0), 5))


def test_specialised_launch_packs_like_the_general_rule():
    """The generated fast path writes the same bytes as shimrt.args.encode for every kind of value."""
    from shimrt.launchpath import LaunchState, build_launch

    layout = [(0, 8), (8, 8), (16, 4), (20, 4), (24, 8), (32, 2)]
    seen = []

    class Dev:  # the device's one part a launch function reads when built: the null stream
        @staticmethod
        def stream_ref(stream):
            return 0

    streams = []

    def raw(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        streams.append(stream)
        pointers = (ctypes.c_void_p * len(layout)).from_address(params)
        seen.append([ctypes.string_at(pointers[i], s) for i, (_, s) in enumerate(layout)])
        return (0,)

    class Drv:
        def mem_free(self, ptr):
            pass

        def stream_destroy(self, handle):
            pass

    from shimrt.memory import Buffer
    Dev.driver = Drv()
    buffer = Buffer(Dev(), 0x7000, 8, (2,), np.float32, owner=None)
    state = LaunchState("fn", raw, smem_limit=49152, block_limit=1024, checked=lambda *a: seen.append("checked"),
                        failed=lambda *a: seen.append("failed"))
    dev = Dev()
    launch = build_launch("k", layout, dev, state)
    cases = [
        (CudaArrayLike(0x1000), CudaArrayLike(0x2000), 1.5, -3, 2**40, 7),
        (CudaArrayLike(0x3000), CudaArrayLike(0x4000), np.float32(2.5), 2**32 - 1, -1.25, np.int16(-2)),
        (CudaArrayLike(0x5000), CudaArrayLike(0x6000), 7, np.uint32(9), np.float64(3.0), 1),
        (buffer, 2**64 - 1, -2**31, 2**32 - 1, -2**63, -2**15),      # limits of every width
        (buffer, -1, 3.4e38, float("nan"), 2**63, True),            # unsigned-only values, float32 edges
    ]
    for args in cases:
        launch(4, 128, *args)
        assert seen.pop() == [encode(i, a, s) for i, (a, (_, s)) in enumerate(zip(args, layout, strict=True))]
    launch((4, 1.0), 128, *cases[0])  # a float in a grid, a wrong count, a size too large: the checked path
    launch(4, 128, *cases[0][:-1])
    launch(4, 2048, *cases[0])
    assert seen == ["checked"] * 3
    seen.clear()
    with pytest.raises(UsageError, match="does not fit"):
        launch(4, 128, CudaArrayLike(1), CudaArrayLike(2), 2**33, 0, 0, 0)
    with pytest.raises(UsageError, match="beyond the range of the kernel's float32"):
        launch(4, 128, buffer, buffer, 1e39, 0, 0, 0)
    buffer.free()
    with pytest.raises(UsageError, match="freed"):
        launch(4, 128, buffer, buffer, 1.0, 0, 0, 0)
    assert not seen  # nothing launched on a refusal
    # A shimrt Stream of the kernel's device goes by its launch handle; the null stream by the device's.
    from shimrt.stream import Stream
    streams.clear()
    s = Stream(dev, "handle-of-s")
    launch(4, 128, *cases[0], stream=s)
    launch(4, 128, *cases[0])
    assert streams == ["handle-of-s", 0]
