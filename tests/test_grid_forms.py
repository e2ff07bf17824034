"""Every documented grid and block form on the launch fast path, without a GPU: a Kernel made by its
own constructor over a stand-in driver whose launch records the dimensions and parameter bytes."""

from __future__ import annotations

import ctypes
import enum
import itertools
import types

import numpy as np
import pytest

from shimrt import UsageError
from shimrt.args import encode
from shimrt.kernel import Kernel, Module
from shimrt.launchpath import MAX_BLOCK, MAX_GRID, dim3, launch_dims
from shimrt.targets import get


class _Driver:
    """What a Kernel asks of its backend; ``launched`` gets (dims, parameter bytes) per launch."""

    def __init__(self, layout, max_threads):
        self.layout, self.max_threads, self.launched = layout, max_threads, []

    def function_attributes(self, fn):
        return {"max_threads_per_block": self.max_threads, "max_dynamic_smem": 48 * 1024, "static_smem": 0,
                "registers": 32}

    def function_param_layout(self, fn):
        return self.layout

    def module_function(self, handle, name):
        return "fn"

    def module_unload(self, handle):
        pass

    def launcher(self):
        def raw(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            pointers = (ctypes.c_void_p * len(self.layout)).from_address(params)
            self.launched.append(((gx, gy, gz, bx, by, bz),
                                  [ctypes.string_at(pointers[i], s) for i, (_, s) in enumerate(self.layout)]))
            return (0,)
        return raw


class _Device:
    name, index, target = "stand-in", 0, get("H200")

    def __init__(self, drv):
        self.driver = drv

    def stream_ref(self, stream):
        return 0

    def activate(self):
        pass


def _kernel(layout=((0, 8),), max_threads=256) -> tuple[Module, Kernel, list]:
    """(module, its kernel ``k`` with the fast path built, the launches recorded)."""
    drv = _Driver(list(layout), max_threads)
    program = types.SimpleNamespace(name="stand-in", kernels=["k"], resources={}, params={}, names={})
    module = Module(_Device(drv), "handle", program)
    kernel = module["k"]
    assert hasattr(kernel.launch, "source")  # the specialised function, not the general method
    return module, kernel, drv.launched


class Small(enum.IntEnum):
    FOUR = 4


# (grid, block) -> the (gx, gy, gz, bx, by, bz) launched.
FORMS = {
    "ints": ((4, 256), (4, 1, 1, 256, 1, 1)),
    "1-tuples": (((4,), (256,)), (4, 1, 1, 256, 1, 1)),
    "2-tuples": (((4, 3), (16, 8)), (4, 3, 1, 16, 8, 1)),
    "3-tuples": (((4, 1, 1), (256, 1, 1)), (4, 1, 1, 256, 1, 1)),
    "3-d grid and block": (((3, 2, 2), (8, 4, 2)), (3, 2, 2, 8, 4, 2)),
    "lists": (([4], [256]), (4, 1, 1, 256, 1, 1)),
    "3-lists": (([3, 2, 2], [8, 4, 2]), (3, 2, 2, 8, 4, 2)),
    "int grid, tuple block": ((5, (8, 8, 4)), (5, 1, 1, 8, 8, 4)),
    "tuple grid, int block": (((5, 6, 7), 32), (5, 6, 7, 32, 1, 1)),
    "numpy ints": ((np.int64(4), np.int32(256)), (4, 1, 1, 256, 1, 1)),
    "numpy ints of every width": ((np.uint8(200), np.uint16(256)), (200, 1, 1, 256, 1, 1)),
    "numpy ints in tuples": (((np.int64(3), 2, np.uint32(2)), [np.int16(8), np.int8(4), np.uint64(2)]),
                             (3, 2, 2, 8, 4, 2)),
    "largest grid": ((MAX_GRID, (4, 1, 64)), (*MAX_GRID, 4, 1, 64)),
    "largest block y and z": ((1, (1, 4, 64)), (1, 1, 1, 1, 4, 64)),
    "block at the kernel's limit": ((2**31 - 1, (16, 16)), (2**31 - 1, 1, 1, 16, 16, 1)),
}

# grid or block values the fast path leaves to the checked path (each refused there too).
REFUSED_DIMS = [0, -1, (), (1, 1, 1, 1), [2, 2, 2, 2], (0,), (4, 0), (4, 1, -1), 1.0, 4.5, (4.0,), True, False,
                np.True_, (True,), (1, np.bool_(True)), np.float32(4), "4", None, [[4]], (4, "1"), 1j]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_launches_with_its_dims(form):
    (grid, block), dims = FORMS[form]
    assert launch_dims(grid, block, 256) == dims
    assert all(type(d) is int for d in launch_dims(grid, block, 256))
    _, kernel, launched = _kernel()
    kernel.launch(grid, block, 0x1000)
    assert launched == [(dims, [(0x1000).to_bytes(8, "little")])]


def test_the_fast_path_takes_exactly_what_dim3_takes_within_the_kernel_limit():
    """Over a matrix of values at and around every bound, launch_dims gives dim3's dims, or None
    only where dim3 refuses, the block exceeds the kernel's threads or the form is not one the fast
    path takes (an int subclass)."""
    edges = {0, 1, 2, 63, 64, 65, 255, 256, 257, 1024, 1025, 65535, 65536, 2**31 - 1, 2**31, -1}
    values = [v for e in sorted(edges) for v in (e, (e,), (1, e), (1, 1, e), (e, 1, 1), [e, 2])]
    values += [np.int64(65535), (np.uint16(65535), np.int64(65536)), Small.FOUR, (Small.FOUR, 1)]
    taken = 0
    for threads in (256, 1024):
        for grid, block in itertools.product(values, repeat=2):
            got = launch_dims(grid, block, threads)
            try:
                want = dim3(grid, "grid", MAX_GRID) + dim3(block, "block", MAX_BLOCK)
            except UsageError:
                want = None
            if want is not None and want[3] * want[4] * want[5] > threads:
                want = None
            if Small in {type(v) for v in (grid, block, *np.ravel(np.asarray(grid, object)),
                                           *np.ravel(np.asarray(block, object)))}:
                assert got is None  # valid, but for the checked path
                continue
            assert got == want, (grid, block, threads)
            taken += got is not None
    assert taken > 1000  # the matrix holds many valid launches, not only refusals


@pytest.mark.parametrize("bad", REFUSED_DIMS, ids=repr)
def test_refused_forms_leave_for_the_checked_path_and_its_messages(bad):
    module, kernel, launched = _kernel()
    assert launch_dims(bad, 32, 256) is None and launch_dims(1, bad, 256) is None
    for args in ((bad, 32, 0x1000), (1, bad, 0x1000)):
        with pytest.raises(UsageError) as fast:
            kernel.launch(*args)
        with pytest.raises(UsageError) as checked:
            Kernel.launch(kernel, *args)  # the general method: every check, then the launch
        assert str(fast.value) == str(checked.value)
        assert repr(bad) in str(fast.value) and ("grid" if args[0] is bad else "block") in str(fast.value)
    assert not launched


@pytest.mark.parametrize("grid,block,message", [
    ((1, 65536), 32, "grid must be at most"), ((1, 1, 65536), 32, "grid must be at most"),
    (2**31, 32, "grid must be at most"), ((2**31, 1), 32, "grid must be at most"),
    (1, (1, 1025), "block must be at most"), (1, (1, 1, 65), "block must be at most"),
    (1, 257, "exceeds its limit"), (1, (16, 17), "exceeds its limit"), (1, (2, 2, 65), "block must be at most"),
    (np.int64(1), (8, 8, np.int32(8)), "a block of 512 threads exceeds its limit of 256"),
    ((np.uint64(2**63),), 32, "grid must be at most"),
])
def test_out_of_range_dims_raise_the_checked_paths_errors(grid, block, message):
    _, kernel, launched = _kernel(max_threads=256)
    assert launch_dims(grid, block, 256) is None
    with pytest.raises(UsageError, match=message) as fast:
        kernel.launch(grid, block, 0x1000)
    with pytest.raises(UsageError) as checked:
        Kernel.launch(kernel, grid, block, 0x1000)
    assert str(fast.value) == str(checked.value)
    assert not launched


def test_other_mistakes_with_tuple_forms_keep_their_messages():
    module, kernel, launched = _kernel(max_threads=256)
    for args, kwargs, message in [
        (((4,), (32,)), {}, "takes 1 arguments.*got 0"),
        (((4,), (32,), 1, 2), {}, "takes 1 arguments.*got 2"),
        (((4,), (32,), 0x1000), {"dynamic_smem": 0.5}, "dynamic_smem must be an int"),
        (((4,), (32,), 0x1000), {"dynamic_smem": 1 << 30}, "dynamic_smem must be an int of at most"),
        (((4,), (32,), "text"), {}, "cannot pass str"),
    ]:
        with pytest.raises(UsageError, match=message):
            kernel.launch(*args, **kwargs)
    module.close()
    for grid, block in (((4,), (32,)), (4, 32), (np.int64(4), [32])):
        with pytest.raises(UsageError, match="module is closed"):
            kernel.launch(grid, block, 0x1000)
    assert not launched


def test_an_int_subclass_launches_through_the_checked_path():
    _, kernel, launched = _kernel()
    kernel.launch(Small.FOUR, (Small.FOUR, 2), 0x1000)
    assert launched[0][0] == (4, 1, 1, 4, 2, 1)


def test_int_grids_never_call_the_dims_helper():
    """The int case is tested first, in the generated code itself: it pays for no call."""
    _, kernel, launched = _kernel()
    calls = []
    kernel.launch.__globals__["launch_dims"] = lambda *a: calls.append(a) or launch_dims(*a)
    kernel.launch(4, 32, 0x1000)
    assert not calls
    kernel.launch((4,), 32, 0x1000)
    assert calls == [((4,), 32, 256)]
    assert [dims for dims, _ in launched] == [(4, 1, 1, 32, 1, 1)] * 2
    src = kernel.launch.source
    assert src.index("type(grid) is type(block) is int") < src.index("launch_dims(")


def _nan32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


def _nan64(bits: int) -> np.float64:
    return np.array([bits], np.uint64).view(np.float64)[0]


# Parameters of 8, 4, 4, 2, 1 and 8 bytes, each aligned to its size.
LAYOUT = [(0, 8), (8, 4), (12, 4), (16, 2), (18, 1), (24, 8)]
NUMPY_ARGS = [
    (np.int64(-2**63), np.int32(-2**31), np.uint32(2**32 - 1), np.int16(-2**15), np.int8(-128), np.uint64(2**64 - 1)),
    (np.uint64(7), np.float32(2.5), np.float32(-0.0), np.uint16(65535), np.uint8(255), np.float64(-1e-300)),
    (np.float64(np.pi), np.float32(3.4e38), np.float32(np.inf), np.int16(7), np.int8(5), np.longlong(-9)),
    (np.ulonglong(2**63), np.intc(-5), np.uintc(6), np.uint16(3), np.uint8(0), np.int64(2**62)),
    (_nan64(0x7FF0000000000001), np.float32(1e-45), np.int32(0), np.int16(-1), np.int8(-1), _nan64(0xFFF8000000000123)),
]


@pytest.mark.parametrize("args", NUMPY_ARGS, ids=lambda a: ",".join(type(v).__name__ for v in a))
def test_numpy_scalars_land_exactly_without_the_general_rule(args):
    _, kernel, launched = _kernel(LAYOUT)
    general = []
    kernel.launch.__globals__["encode"] = lambda *a: general.append(a) or encode(*a)
    kernel.launch((2, 2), (32, 2), *args)
    assert launched == [((2, 2, 1, 32, 2, 1), [v.tobytes() for v in args])]
    assert not general  # each written as one item of a typed view


def test_float32_nans_keep_their_bits_through_the_general_rule():
    """Converting a float32 to a float quiets a signalling NaN; the general rule copies its bytes."""
    _, kernel, launched = _kernel(LAYOUT)
    quiet, signalling = _nan32(0x7FC00123), _nan32(0x7F800001)
    kernel.launch(1, 32, np.int64(1), quiet, signalling, np.int16(0), np.int8(0), np.int64(0))
    assert launched[0][1][1:3] == [quiet.tobytes(), signalling.tobytes()]
    assert signalling.tobytes() == (0x7F800001).to_bytes(4, "little")


@pytest.mark.parametrize("slot,value,message", [
    (0, np.float32(1), "argument 0: numpy.float32 is 4 bytes but the kernel's parameter is 8 bytes"),
    (1, np.float64(1), "argument 1: numpy.float64 is 8 bytes but the kernel's parameter is 4 bytes"),
    (2, np.int64(1), "argument 2: numpy.int64 is 8 bytes but the kernel's parameter is 4 bytes"),
    (3, np.float16(1), None), (3, np.int32(1), "argument 3: numpy.int32 is 4 bytes but"),
    (4, np.bool_(True), None), (4, True, None), (2, False, None), (5, np.longdouble(1), "is 16 bytes but"),
])
def test_other_scalars_follow_the_general_rule(slot, value, message):
    _, kernel, launched = _kernel(LAYOUT)
    args = [np.int64(1), np.float32(1), np.int32(1), np.int16(1), np.int8(1), np.int64(1)]
    args[slot] = value
    if message is None:
        kernel.launch(1, 32, *args)
        assert launched[0][1][slot] == encode(slot, value, LAYOUT[slot][1])
    else:
        with pytest.raises(UsageError, match=message):
            kernel.launch((1,), (32,), *args)
        assert not launched
