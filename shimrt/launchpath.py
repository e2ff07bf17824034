"""The launch fast path of :class:`shimrt.kernel.Kernel`: grid and block dimensions, and the launch
function built per kernel.

``Kernel.launch`` is on the critical path of every step a user times, so for each kernel whose
parameter layout the driver reports, :func:`build_launch` makes (once, at first use) a small Python
function with the layout baked in: each argument is written straight into a per-thread parameter
block at its offset, with no loop and no lookups of the layout. A device array's pointer comes from
a per-type getter (:func:`shimrt.args.pointer_getters`: a shimrt Buffer's attribute, a torch
tensor's ``data_ptr()``, a CuPy array's ``data.ptr``), so torch and CuPy arguments cost about what
Buffers do; numpy scalars of the parameter's size are written as one item of a typed view too.

Grid and block take every documented form there: an int (tested first, at no extra cost), a tuple
or list of 1-3 ints, numpy integers in either place (:func:`launch_dims`). Anything else (a value
out of range, a float or bool, a stream of another library, dynamic smem above the current limit, a
wrong argument count) goes to the fully checked path, ``Kernel._launch_checked``, so the rules and
messages of :func:`dim3` and :mod:`shimrt.args` hold either way. The Kernel and its function share
one :class:`LaunchState` (the seam: the two are one unit, split only for length), and the function
reads a Stream's public ``launch_device`` and ``launch_handle``.
"""

from __future__ import annotations

import functools
import struct
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .args import Packer, encode, pointer_getters
from .errors import UsageError
from .memory import Buffer
from .stream import Stream

__all__ = ["MAX_GRID", "MAX_BLOCK", "dim3", "LaunchState", "build_launch"]

if TYPE_CHECKING:
    from .device import Device

#: The most blocks of a grid in x, y and z.
MAX_GRID = (2**31 - 1, 65535, 65535)
#: The most threads of a block in x, y and z; x is bounded by the kernel's own limit on the product
#: (at most 1024 threads).
MAX_BLOCK = (None, 1024, 64)
_GRID_X, _GRID_Y, _GRID_Z = MAX_GRID
_BLOCK_Y, _BLOCK_Z = MAX_BLOCK[1:]
# numpy's integer scalar types (np.bool_ is not one): they stand for their value in a grid or block.
_NUMPY_INTS = frozenset(np.dtype(code).type for code in "bBhHiIlLqQ")


def dim3(value: Any, what: str, most: tuple) -> tuple[int, int, int]:
    """``value`` (an int or a tuple or list of 1-3 ints, numpy integers too) as 3 dimensions, each
    positive and at most ``most`` (None: no bound of its own); UsageError naming ``what`` otherwise."""
    parts = value if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(parts) <= 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                            for v in parts):
        raise UsageError(f"{what} must be an int or a tuple of 1-3 ints, not {value!r}")
    given = [int(v) for v in parts] + [1, 1]
    dims = (given[0], given[1], given[2])
    bounds = "(" + ", ".join("-" if m is None else str(m) for m in most) + ")"
    if any(d < 1 for d in dims):
        raise UsageError(f"{what} must be positive in every dimension (and at most {bounds}), not {value!r}")
    if any(m is not None and d > m for d, m in zip(dims, most, strict=True)):
        raise UsageError(f"{what} must be at most {bounds} in each dimension, not {value!r}: {dims} exceeds the "
                         "limits")
    return dims


def launch_dims(grid: Any, block: Any, threads: int) -> tuple[int, int, int, int, int, int] | None:
    """``(gx, gy, gz, bx, by, bz)`` of a launch whose grid and block :func:`dim3` accepts (within
    :data:`MAX_GRID` and :data:`MAX_BLOCK`) with at most ``threads`` threads a block, for the forms
    the fast path takes: exact ints, numpy integers, tuples and lists of 1-3 of them. None for
    anything else, valid or not: the checked path then takes it and says what is wrong.

    Never raises; the values are Python ints. Unrolled, since loops over the dimensions measured
    twice as slow.
    """
    if type(grid) is tuple or type(grid) is list:
        n = len(grid)
        if n == 1:
            (gx,), gy, gz = grid, 1, 1
        elif n == 3:
            gx, gy, gz = grid
        elif n == 2:
            (gx, gy), gz = grid, 1
        else:
            return None
    else:
        gx, gy, gz = grid, 1, 1
    if type(block) is tuple or type(block) is list:
        n = len(block)
        if n == 1:
            (bx,), by, bz = block, 1, 1
        elif n == 3:
            bx, by, bz = block
        elif n == 2:
            (bx, by), bz = block, 1
        else:
            return None
    else:
        bx, by, bz = block, 1, 1
    if not type(gx) is type(gy) is type(gz) is type(bx) is type(by) is type(bz) is int:
        # numpy integers as Python ints (their products must not wrap); any other type as 0, refused
        # below. Unrolled: a comprehension costs twice as much.
        gx = gx if type(gx) is int else int(gx) if type(gx) in _NUMPY_INTS else 0
        gy = gy if type(gy) is int else int(gy) if type(gy) in _NUMPY_INTS else 0
        gz = gz if type(gz) is int else int(gz) if type(gz) in _NUMPY_INTS else 0
        bx = bx if type(bx) is int else int(bx) if type(bx) in _NUMPY_INTS else 0
        by = by if type(by) is int else int(by) if type(by) in _NUMPY_INTS else 0
        bz = bz if type(bz) is int else int(bz) if type(bz) in _NUMPY_INTS else 0
    if (0 < gx <= _GRID_X and 0 < gy <= _GRID_Y and 0 < gz <= _GRID_Z
            and 0 < by <= _BLOCK_Y and 0 < bz <= _BLOCK_Z and 0 < bx and bx * by * bz <= threads):
        return gx, gy, gz, bx, by, bz
    return None


_MISSING = object()  # an argument the caller did not give
# size -> the memoryview formats of an unsigned and a signed item of that size.
_FORMATS = {1: ("B", "b"), 2: ("H", "h"), 4: ("I", "i"), 8: ("Q", "q")}


def _numpy_formats() -> dict[int, dict[type, str]]:
    """size -> {numpy scalar type: the memoryview format that holds its value exactly}, the
    commonest first (float16, longdouble, complex and np.bool_ are left to the general rule)."""
    by_size: dict[int, dict[type, str]] = {}
    for code in "lLdfiIqQhHbB":
        dt = np.dtype(code)
        fmt = code if dt.kind == "f" else _FORMATS[dt.itemsize][dt.kind == "i"]
        by_size.setdefault(dt.itemsize, {}).setdefault(dt.type, fmt)
    return by_size


_NUMPY_FORMATS = _numpy_formats()


class LaunchState:
    """What a :class:`shimrt.kernel.Kernel` shares with the launch function built for it: the
    function handle and the driver's launch call (fixed), the dynamic smem limit (raised when the
    Kernel opts in) and the block limit (0 once the module is closed, which sends every launch to
    the checked path), both read at each launch; the Kernel's checked path and its handler of a
    failed launch; one parameter block per thread (the launch call releases the GIL, so threads
    launching one kernel must not share one)."""

    __slots__ = ("fn", "raw_launch", "smem_limit", "block_limit", "checked", "failed", "local")

    def __init__(self, fn: Any, raw_launch: Callable[..., Any], smem_limit: int, block_limit: int,
                 checked: Callable[..., None], failed: Callable[..., None]):
        self.fn, self.raw_launch, self.checked, self.failed = fn, raw_launch, checked, failed
        self.smem_limit, self.block_limit = smem_limit, block_limit
        self.local = threading.local()


def thread_block(name: str, layout: list, local: threading.local, formats: tuple[str, ...]) -> tuple:
    """This thread's parameter block for the fast path, made on its first launch: (pointer-array
    address, then a view of the block as items of each of ``formats``)."""
    packer = Packer(name, layout)
    view, address = packer.block()
    memory: Any = view  # cast() takes the struct format of each parameter, known only at run time
    local.block = (address, *(memory.cast(f) for f in formats))
    local.block_owner = packer  # keeps the ctypes memory alive
    return local.block


def build_launch(name: str, layout: list, device: Device, state: LaunchState) -> Callable[..., None]:
    """A function launch(grid, block, *args, stream=None, dynamic_smem=0) for kernel ``name`` of
    ``device``, specialised to its parameter ``layout`` (see the module docstring).

    Each argument is written as one item of a typed memoryview of the parameter block (about a
    third of the cost of a struct pack): a pointer through the unsigned view, a Python int
    through the signed one (out of its range: the general rule, which also takes unsigned
    values), a float through the floating one (float32 by struct, which refuses overflow), a
    numpy scalar of the parameter's size through the view of its own type (a float32 NaN by the
    general rule: converting it would quiet a signalling NaN). Any other value, and any parameter
    of another size or alignment, goes through the general rule (:func:`shimrt.args.encode`),
    which also raises every error.
    """
    n = len(layout)
    names = [f"a{i}" for i in range(n)]
    ns = {
        "state": state, "device": device, "Stream": Stream, "Buffer": Buffer, "encode": encode,
        # Fixed for the kernel's life (a closed module fails the guard before they are used):
        "fn": state.fn, "raw_launch": state.raw_launch, "local": state.local, "checked": state.checked,
        "failed": state.failed, "new_block": functools.partial(thread_block, name, layout, state.local),
        "null": device.stream_ref(None), "pointers": pointer_getters(), "ZERO": 0,
        "pack_f4": struct.Struct("<f").pack_into, "launch_dims": launch_dims, "MISSING": _MISSING,
    }
    formats: list[str] = []

    def view_of(fmt: str) -> str:
        if fmt not in formats:
            formats.append(fmt)
        return f"view_{fmt}"

    body = []
    for i, (offset, size) in enumerate(layout):
        a = names[i]
        generic = f"view_B[{offset}:{offset + size}] = encode({i}, {a}, {size})"  # every rule and message
        view_of("B")
        if size not in _FORMATS or offset % size:  # a struct by value, or an unaligned slot
            body.append(f"    {generic}")
            continue
        unsigned, signed = view_of(_FORMATS[size][0]), view_of(_FORMATS[size][1])
        k = offset // size
        lines = [f"    t = type({a})"]
        if size == 8:  # a device array first (the commonest): a Buffer's pointer, or its type's getter
            lines += ["    if t is Buffer:", f"        p = {a}.device_pointer", "        if p is None:",
                      f"            {generic}", "        else:", f"            {unsigned}[{k}] = p",
                      "    elif t is int:"]
        else:
            lines += ["    if t is int:"]
        lines += ["        try:", f"            {signed}[{k}] = {a}", "        except ValueError:",
                  f"            {generic}"]
        if size == 8:
            lines += ["    elif t is float:", f"        {view_of('d')}[{k}] = {a}"]
        elif size == 4:  # struct, not the view: a value beyond float32's range must raise, not become inf
            lines += ["    elif t is float:", "        try:", f"            pack_f4(view_B, {offset}, {a})",
                      "        except OverflowError:", f"            {generic}"]
        if size == 8:
            lines += ["    elif (get := pointers.get(t)) is not None:", f"        p = get({a})",
                      "        if p is None:", f"            {generic}", "        else:",
                      f"            {unsigned}[{k}] = p"]
        for np_type, fmt in _NUMPY_FORMATS.get(size, {}).items():
            ns[f"np_{np_type.__name__}"] = np_type
            lines += [f"    elif t is np_{np_type.__name__}:"]
            if fmt == "f":
                lines += [f"        if {a} == {a}:", f"            {view_of(fmt)}[{k}] = {a}", "        else:",
                          f"            {generic}"]
            else:
                lines += [f"        {view_of(fmt)}[{k}] = {a}"]
        body += lines + ["    else:", f"        {generic}"]
    block = ", ".join(["address"] + [f"view_{f}" for f in formats]) + ("," if not formats else "")
    ns["FORMATS"] = tuple(formats)
    # The arguments are named parameters (no tuple to build and unpack); a missing one is the
    # MISSING default and extra ones land in ``extra``, both sent to the checked path.
    params = "".join(f"{a}=MISSING, " for a in names)
    given = f"[a for a in ({', '.join(names)}{',' if n == 1 else ''}) if a is not MISSING] + list(extra)" \
        if n else "list(extra)"
    # Floats, bools, wrong counts and values out of range leave for the checked path, which says
    # precisely what is wrong. Types first: the comparisons then see ints only.
    rest = ("(dynamic_smem is ZERO or type(dynamic_smem) is int and 0 <= dynamic_smem <= state.smem_limit)"
            f"{f' and {names[-1]} is not MISSING' if n else ''} and not extra")
    src = "\n".join([
        f"def launch(grid, block, {params}*extra, stream=None, dynamic_smem=0):",
        # Int grid and block first, in one test with the rest (splitting it measured ~20 ns slower).
        f"    if (type(grid) is type(block) is int and 0 < grid <= {_GRID_X}",
        "            and 0 < block <= state.block_limit",
        f"            and {rest}):",
        "        gy = gz = by = bz = 1",
        f"    elif not ({rest}) or (dims := launch_dims(grid, block, state.block_limit)) is None:",
        f"        return checked(grid, block, {given}, stream, dynamic_smem)",
        "    else:",
        "        grid, gy, gz, block, by, bz = dims",
        "    if stream is None:",
        "        handle = null",
        "    elif type(stream) is Stream and stream.launch_device is device:",
        "        handle = stream.launch_handle",
        "    else:",
        "        handle = device.stream_ref(stream)",
        "    try:",
        f"        {block} = local.block",
        "    except AttributeError:",
        f"        {block} = new_block(FORMATS)",
        *body,
        "    err = raw_launch(fn, grid, gy, gz, block, by, bz, dynamic_smem, handle, address, 0)[0]",
        "    if err:",
        "        failed(err, (grid, gy, gz), (block, by, bz), dynamic_smem, handle, address)",
    ])
    exec(compile(src, f"<shimrt launch of {name}>", "exec"), ns)
    launch = ns["launch"]
    launch.source = src  # for the curious and for tests
    return launch
