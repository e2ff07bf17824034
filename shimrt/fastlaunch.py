"""Per-kernel launch functions specialised to the kernel's parameter layout.

``Kernel.launch`` is on the critical path of every step a user times, so for each kernel
whose parameter layout the driver reports, shimrt builds (once, at first use) a small Python
function with the layout baked in: each argument is written straight into a per-thread
parameter block at its offset, with no loop and no lookups of the layout. Anything outside
the common case (tuples for grid or block, a stream of another library, dynamic smem above
the current limit, a value that is not a Buffer or a plain number) falls back to the fully
checked path, so the rules in :mod:`shimrt.args` hold either way.
"""

from __future__ import annotations

import struct

from .args import encode

_PUT = {  # size -> (struct code for a Python int, for a Python float)
    1: ("b", None), 2: ("h", None), 4: ("i", "f"), 8: ("q", "d"),
}


def build(kernel, stream_type):
    """A function launch(grid, block, *args, stream=None, smem=0) for ``kernel``."""
    layout = kernel.param_layout
    n = len(layout)
    names = [f"a{i}" for i in range(n)]
    ns = {
        "kernel": kernel, "device": kernel.device, "Stream": stream_type, "encode": encode,
        # Fixed for the kernel's life (a closed module fails the guard before they are used):
        "fn": kernel._fn, "raw_launch": kernel._launch, "local": kernel._local, "null": kernel.device._null,
        "put_ptr": struct.Struct("<Q").pack_into, "StructError": struct.error,
    }
    body = []
    for i, (offset, size) in enumerate(layout):
        a = names[i]
        generic = f"view[{offset}:{offset + size}] = encode({i}, {a}, {size})"
        if size == 8:  # a Buffer's pointer, else the general rule
            body += ["    try:", f"        put_ptr(view, {offset}, {a}.device_pointer)",
                     "    except (AttributeError, StructError):", f"        {generic}"]
        elif size in _PUT:
            int_code, float_code = _PUT[size]
            ns[f"put_i{size}"] = struct.Struct("<" + int_code).pack_into
            lines = [f"    if type({a}) is int:", "        try:", f"            put_i{size}(view, {offset}, {a})",
                     "        except StructError:", f"            {generic}"]
            if float_code:
                ns[f"put_f{size}"] = struct.Struct("<" + float_code).pack_into
                lines += [f"    elif type({a}) is float:", f"        put_f{size}(view, {offset}, {a})"]
            body += lines + ["    else:", f"        {generic}"]
        else:
            body.append(f"    {generic}")
    unpack = f"    {', '.join(names)}{',' if n == 1 else ''} = args" if n else ""
    src = "\n".join([
        "def launch(grid, block, *args, stream=None, smem=0):",
        # Tuples, floats, wrong counts (the unpacking) and sizes out of range leave for the
        # checked path, which says precisely what is wrong.
        "    try:",
        "        if not (type(grid) is int and type(block) is int and type(smem) is int",
        "                and 0 < grid <= 2147483647 and 0 < block <= kernel._fast_block_limit",
        "                and 0 <= smem <= kernel._smem_limit):",
        "            return kernel._launch_checked(grid, block, args, stream, smem)",
        f"    {unpack}" if n else "        if args: raise ValueError",
        "    except (TypeError, ValueError):",
        "        return kernel._launch_checked(grid, block, args, stream, smem)",
        "    if stream is None:",
        "        handle = null",
        "    elif type(stream) is Stream and stream._launch_device is device:",
        "        handle = stream._handle",
        "    else:",
        "        handle = device._stream_handle(stream)",
        "    try:",
        "        view, address = local.block",
        "    except AttributeError:",
        "        view, address = kernel._thread_block()",
        *body,
        "    err = raw_launch(fn, grid, 1, 1, block, 1, 1, smem, handle, address, 0)[0]",
        "    if err:",
        "        kernel._launch_failed(err, (grid, 1, 1), (block, 1, 1), smem, handle, address)",
    ])
    exec(compile(src, f"<shimrt launch of {kernel.name}>", "exec"), ns)
    launch = ns["launch"]
    launch.__doc__ = type(kernel).launch.__doc__
    launch.source = src  # for the curious and for tests
    return launch
