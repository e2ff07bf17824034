"""The collectives' one path, without a GPU: the buffer-size rule of every collective, the table
against the Communicator and against the loaded NCCL's functions, the library cache, and which
library unique_id() asks."""

from __future__ import annotations

import ctypes
import inspect
import os
import re
import threading

import pytest
from conftest import skip_or_fail

from shimrt import CollectiveError, UsageError
from shimrt.arrays import ArrayInfo
from shimrt.nccl import COLLECTIVES, Communicator, buffer_counts, library, nccl_count, unique_id
from shimrt.nccl import collectives as comm_mod

SIZES = (1, 2, 3, 8)
COUNTS = (0, 1, 5, 1000)


def info(count: int, dtype: str = "float32") -> ArrayInfo:
    return ArrayInfo(pointer=0x1000, dtype=dtype, count=count, itemsize=4)


@pytest.fixture(scope="module")
def nccl():
    try:
        return library.load("cuda")
    except CollectiveError as exc:
        skip_or_fail("nccl", f"NCCL is not installed (pip install 'shimrt[nccl]'): {exc}")


# --- the size rule ------------------------------------------------------------------------------

def expected(collective: str, count: int, size: int) -> tuple[int, int]:
    """nccl.h's meaning of each count, written out independently of the table."""
    if collective == "all_gather":
        return count, count * size          # sendcount; the receive holds every rank's
    if collective == "reduce_scatter":
        return count * size, count          # recvcount; the send holds a block per rank
    return count, count


@pytest.mark.parametrize("collective", sorted(COLLECTIVES))
@pytest.mark.parametrize("size", SIZES)
def test_buffer_counts_and_nccl_count_agree_with_nccl_h(collective, size):
    for count in COUNTS:
        send, recv = buffer_counts(collective, count, size)
        assert (send, recv) == expected(collective, count, size)
        assert nccl_count(collective, info(send), info(recv), size) == count
        # The same buffers described by their send count or their larger count.
        assert buffer_counts(collective, send, size, given="send") == (send, recv)
        assert buffer_counts(collective, max(send, recv), size, given="largest") == (send, recv)


@pytest.mark.parametrize("size", SIZES)
def test_counts_that_do_not_split_into_blocks_round_down(size):
    assert buffer_counts("reduce_scatter", 10 * size + size - 1, size, given="send") == (10 * size, 10)
    assert buffer_counts("all_gather", 10 * size + size - 1, size, given="largest") == (10, 10 * size)
    assert buffer_counts("all_reduce", 10 * size + size - 1, size, given="largest") == (11 * size - 1,) * 2


@pytest.mark.parametrize("size", SIZES)
def test_short_buffers_are_refused_naming_the_counts(size):
    k = 7
    with pytest.raises(UsageError, match=rf"^all_gather: receive holds {k * size - 1} elements, "
                                         rf"needs {k} x {size} ranks = {k * size}$"):
        nccl_count("all_gather", info(k), info(k * size - 1), size)
    with pytest.raises(UsageError, match=rf"^reduce_scatter: send holds {k * size - 1} elements, "
                                         rf"needs {k} x {size} ranks = {k * size}$"):
        nccl_count("reduce_scatter", info(k * size - 1), info(k), size)
    for collective in ("all_reduce", "broadcast", "reduce"):
        for recv in (k - 1, k + 1):
            with pytest.raises(UsageError, match=rf"^{collective}: receive holds {recv} elements, send {k}; "
                                                 "they must be equal$"):
                nccl_count(collective, info(k), info(recv), size)


@pytest.mark.parametrize("size", SIZES)
def test_a_larger_gathering_side_is_accepted(size):
    assert nccl_count("all_gather", info(4), info(4 * size + 3), size) == 4
    assert nccl_count("reduce_scatter", info(4 * size + 3), info(4), size) == 4


@pytest.mark.parametrize("call, message", [
    (lambda: buffer_counts("all_to_all", 4, 2), "collective must be one of all_reduce, .*not 'all_to_all'"),
    (lambda: buffer_counts("all_reduce", 4, 0), "size must be an int in 1..2147483647, not 0"),
    (lambda: buffer_counts("all_reduce", 4, True), "size must be an int in 1..2147483647, not True"),
    (lambda: buffer_counts("all_reduce", 4, 2**31), "size must be an int in 1..2147483647, not 2147483648"),
    (lambda: buffer_counts("all_reduce", -1, 2), "count must be an int in 0..18446744073709551615, not -1"),
    (lambda: buffer_counts("all_reduce", 2**64, 2), "count must be an int in 0..18446744073709551615, not 1844"),
    (lambda: buffer_counts("all_reduce", 4.0, 2), "count must be an int in 0..18446744073709551615, not 4.0"),
    (lambda: buffer_counts("all_reduce", 4, 2, given="recv"), "given must be one of nccl, send, largest"),
    (lambda: nccl_count("gather", info(1), info(1), 1), "not 'gather'"),
    (lambda: nccl_count("all_gather", info(1), info(2), -2), "size must be an int in 1..2147483647, not -2"),
])
def test_bad_arguments_of_the_rule_are_refused(call, message):
    with pytest.raises(UsageError, match=message):
        call()


# --- the table -------------------------------------------------------------------------------

NOT_COLLECTIVES = {"collective", "prepare", "group", "wait", "abort", "close", "local", "async_error",
                   "all_to_all", "barrier"}  # these two are made of rows: sends and receives, an all_reduce


def test_the_table_covers_exactly_the_communicators_collectives():
    public = {n for n in vars(Communicator) if not n.startswith("_") and callable(getattr(Communicator, n))}
    assert NOT_COLLECTIVES <= public
    assert public - NOT_COLLECTIVES == set(COLLECTIVES)


class Recording(Communicator):
    """A Communicator whose one path records its calls (no device, no NCCL)."""

    def __init__(self):  # nothing to open
        self.calls = []

    def collective(self, name, send, recv=None, **kw):
        self.calls.append((name, send, recv, {k: v for k, v in kw.items() if v is not None and k != "async_op"}))


def test_every_named_method_is_one_call_of_its_row():
    c = Recording()
    c.all_reduce("s", "r", op="max", stream="st")
    c.broadcast("s", root=2)
    c.reduce("s", "r", op="min", root=1)
    c.all_gather("s", "r")
    c.reduce_scatter("s", "r", op="avg")
    c.send("b", 3)
    c.recv("b", 4, stream="st")
    assert c.calls == [("all_reduce", "s", "r", {"op": "max", "stream": "st"}),
                       ("broadcast", "s", None, {"root": 2}),
                       ("reduce", "s", "r", {"op": "min", "root": 1}),
                       ("all_gather", "s", "r", {}),
                       ("reduce_scatter", "s", "r", {"op": "avg"}),
                       ("send", "b", None, {"peer": 3}),
                       ("recv", "b", None, {"peer": 4, "stream": "st"})]
    assert {name for name, *_ in c.calls} == set(COLLECTIVES)


def test_each_rows_arguments_match_its_prototype_and_reach_nccl(nccl):
    """The argument tuple each row builds has the prototype's arity and types: the real NCCL
    takes it and, given no communicator, refuses it for that reason alone."""
    for name, row in COLLECTIVES.items():
        restype, argtypes = library.TABLE[row.function]
        args = row.arguments(0x1000, 0x2000, 16, library.DATATYPES["float32"], library.REDOPS["sum"], 0,
                             ctypes.c_void_p(), ctypes.c_void_p())
        assert len(args) == len(argtypes), name
        result = getattr(nccl, row.function)(*args)
        assert library.RESULTS[result] == "ncclInvalidArgument", name
        assert b"comm argument is NULL" in nccl.ncclGetLastError(None), name


def test_the_rows_say_what_each_collective_takes():
    takes = {name: (row.reduces, row.rank, row.in_place, row.buffers) for name, row in COLLECTIVES.items()}
    assert takes == {"all_reduce": (True, None, True, 2), "broadcast": (False, "root", True, 2),
                     "reduce": (True, "root", True, 2), "all_gather": (False, None, False, 2),
                     "reduce_scatter": (True, None, False, 2), "send": (False, "peer", False, 1),
                     "recv": (False, "peer", False, 1)}
    # The public methods' keywords are what their rows take.
    for name, row in COLLECTIVES.items():
        params = set(inspect.signature(getattr(Communicator, name)).parameters)
        assert ("op" in params) == row.reduces and ("root" in params) == (row.rank == "root"), name
        assert ("peer" in params) == (row.rank == "peer"), name


class DeviceArray:
    """The minimum arrays.describe reads: a __cuda_array_interface__ (nothing is dereferenced)."""

    def __init__(self, count, typestr="<f4", ptr=0x1000):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (count,), "typestr": typestr,
                                         "version": 3}


def test_buffers_options_and_ranks_are_checked_per_row():
    ar, ag, send, bc = (COLLECTIVES[n] for n in ("all_reduce", "all_gather", "send", "broadcast"))
    x = DeviceArray(8)
    s, r = comm_mod.buffers_of("all_reduce", ar, x, None)
    assert s is r and s.count == 8
    with pytest.raises(UsageError, match=r"all_gather needs a receive buffer \(recv=None, in place, is for "
                                         "all_reduce, broadcast, reduce\\)"):
        comm_mod.buffers_of("all_gather", ag, x, None)
    with pytest.raises(UsageError, match="send takes one buffer"):
        comm_mod.buffers_of("send", send, x, DeviceArray(8))
    with pytest.raises(UsageError, match="float32 but receive is int32"):
        comm_mod.buffers_of("all_reduce", ar, x, DeviceArray(8, "<i4", 0x2000))
    assert comm_mod.op_of("all_reduce", ar, None) == library.REDOPS["sum"]
    with pytest.raises(UsageError, match="op must be one of sum, prod, max, min, avg, not 'mean'"):
        comm_mod.op_of("all_reduce", ar, "mean")
    with pytest.raises(UsageError, match="all_gather takes no op"):
        comm_mod.op_of("all_gather", ag, "sum")
    assert comm_mod.rank_of("broadcast", bc, 4, None, None) == 0
    with pytest.raises(UsageError, match=r"root must be a rank in 0..3, not 4"):
        comm_mod.rank_of("broadcast", bc, 4, 4, None)
    with pytest.raises(UsageError, match=r"root must be a rank in 0..3, not True"):
        comm_mod.rank_of("broadcast", bc, 4, True, None)
    with pytest.raises(UsageError, match=r"peer must be a rank in 0..1, not None"):
        comm_mod.rank_of("send", send, 2, None, None)
    with pytest.raises(UsageError, match="broadcast takes no peer"):
        comm_mod.rank_of("broadcast", bc, 2, None, 1)
    with pytest.raises(UsageError, match="all_gather takes no root"):
        comm_mod.rank_of("all_gather", ag, 2, 0, None)


# --- the library: loaded once per path ----------------------------------------------------------

def test_a_second_load_is_the_same_library_and_opens_nothing(nccl, monkeypatch):
    def no_dlopen(*args, **kwargs):
        raise AssertionError("load() opened the library again")
    monkeypatch.setattr(library.ctypes, "CDLL", no_dlopen)
    assert library.load("cuda") is nccl
    assert library.load() is nccl


def test_the_same_file_by_another_path_is_the_same_library(nccl, monkeypatch, tmp_path):
    link = tmp_path / "libnccl-link.so.2"
    link.symlink_to(os.path.realpath(nccl.path))
    monkeypatch.setenv("SHIMRT_NCCL_LIBRARY", str(link))
    assert library.load("cuda") is nccl


def test_threads_loading_at_once_share_one_library(nccl, monkeypatch):
    loader = library.Loader()  # a fresh process's, for this test only
    got, start = [], threading.Barrier(8)

    def one():
        start.wait()
        got.append(loader.load("cuda"))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 8 and len({id(lib) for lib in got}) == 1
    assert got[0] is not nccl and got[0].path == nccl.path and got[0].missing == ()


def test_a_failing_path_is_still_reported_after_a_load(nccl, monkeypatch, tmp_path):
    import os
    original = os.environ.get("SHIMRT_NCCL_LIBRARY")  # the NCCL the fixture loaded, where one was set
    monkeypatch.setenv("SHIMRT_NCCL_LIBRARY", str(tmp_path / "libnccl-nope.so"))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    with pytest.raises(CollectiveError, match="SHIMRT_NCCL_LIBRARY=.*libnccl-nope.so"):
        library.load("hip")
    with pytest.raises(CollectiveError, match="SHIMRT_NCCL_LIBRARY=.*libnccl-nope.so"):
        library.load("cuda")  # the one place searched while it is set: no fall back to the wheel's NCCL
    if original:
        monkeypatch.setenv("SHIMRT_NCCL_LIBRARY", original)
    else:
        monkeypatch.delenv("SHIMRT_NCCL_LIBRARY")
    assert library.load("cuda") is nccl
    monkeypatch.delenv("SHIMRT_NCCL_LIBRARY", raising=False)
    with pytest.raises(CollectiveError, match="RCCL.*rocm/lib/librccl.so.*librccl.so"):
        library.load("hip")


def test_an_unknown_backend_is_refused():
    with pytest.raises(UsageError, match="backend must be one of cuda, hip, not 'metal'"):
        library.load("metal")


# --- unique_id: the library of the backend -------------------------------------------------------

def test_unique_id_comes_from_the_wheels_nccl(nccl, monkeypatch):
    monkeypatch.delenv("SHIMRT_BACKEND", raising=False)
    a, b = unique_id(), unique_id(nccl)
    assert len(a) == len(b) == 128 and any(a) and a != b


def test_unique_id_under_hip_looks_for_rccl(monkeypatch, tmp_path):
    monkeypatch.delenv("SHIMRT_NCCL_LIBRARY", raising=False)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    with pytest.raises(CollectiveError, match=r"RCCL \(librccl.so\) not found.*rocm/lib/librccl.so"):
        unique_id(backend="hip")
    monkeypatch.setenv("SHIMRT_BACKEND", "hip")  # a Device-less process follows SHIMRT_BACKEND
    with pytest.raises(CollectiveError, match="librccl"):
        unique_id()


def test_unique_id_takes_a_lib_or_a_backend(nccl):
    with pytest.raises(UsageError, match="not both"):
        unique_id(nccl, backend="cuda")
    with pytest.raises(UsageError, match="backend must be one of cuda, hip, not 'rocm'"):
        unique_id(backend="rocm")


# --- the typed NCCL seam: Library's methods, on the real library (no GPU needed) ------------------

def test_librarys_typed_calls_check_what_returns_at_once(nccl):
    assert nccl.get_version() == nccl.version
    a, b = nccl.unique_id(), nccl.unique_id()
    assert isinstance(a, library.UniqueId) and any(bytes(a)) and bytes(a) != bytes(b)
    nccl.group_start()
    assert nccl.group_end() == 0  # an empty group
    # A null communicator: NCCL refuses it, and the check says which call and NCCL's last error.
    with pytest.raises(CollectiveError, match=r"ncclCommGetAsyncError failed: ncclInvalidArgument \(4\).*NULL"):
        nccl.async_error(ctypes.c_void_p())


def test_librarys_calls_that_may_wait_for_peers_hand_their_result_back(nccl):
    from shimrt.nccl import CommOptions
    assert nccl.comm_destroy(ctypes.c_void_p()) == 0 and nccl.comm_abort(ctypes.c_void_p()) == 0  # NULL: nothing
    # Rank 5 of 1 joins nothing, with or without a config (here also: no GPU); the result comes back unchecked.
    for config in (None, CommOptions(blocking=True).build(nccl.version)):
        box = ctypes.c_void_p()
        result = nccl.comm_init(box, 1, nccl.unique_id(), 5, config)
        assert result in library.RESULTS and result != 0 and not box.value


def test_prepare_group_takes_only_prepared_calls():
    from shimrt.nccl import prepare_group
    for bad in ((), (lambda: None,), (42,)):
        with pytest.raises(UsageError, match="prepare_group\\(\\) takes calls made by Communicator.prepare"):
            prepare_group(*bad)


def _comm_stand_in(nccl, size):
    """What alltoall.block_calls reads of a Communicator: its size, stream, device's stream handle,
    state (its ncclComm_t) and library (whose functions the calls bind; none is called)."""
    import types
    device = types.SimpleNamespace(stream_handle=lambda s: 0x77)
    state = types.SimpleNamespace(handle=ctypes.c_void_p(0x55), dead=lambda: CollectiveError("dead"))
    return types.SimpleNamespace(size=size, stream="own", device=device, state=state, lib=nccl)


def test_all_to_all_is_a_send_and_a_receive_of_one_block_per_peer(nccl):
    from shimrt.nccl import alltoall
    comm = _comm_stand_in(nccl, 4)
    calls = alltoall.block_calls(comm, DeviceArray(16, ptr=0x1000), DeviceArray(16, ptr=0x9000), None)
    got = [(q.name, q.args[0], q.args[1], q.args[3]) for q in calls]  # function, buffer, count, peer
    assert got == [(kind, base + peer * 4 * 4, 4, peer) for peer in range(4)
                   for kind, base in (("ncclSend", 0x1000), ("ncclRecv", 0x9000))]
    assert all(q.stream == "own" and q.stream_handle == 0x77 and q.what == "all_to_all" for q in calls)


@pytest.mark.parametrize("send, recv, says", [
    (DeviceArray(16), DeviceArray(12, ptr=0x9000), "same count, a multiple of the 4 ranks, not 16 and 12"),
    (DeviceArray(10), DeviceArray(10, ptr=0x9000), "a multiple of the 4 ranks, not 10 and 10"),
    (DeviceArray(16), DeviceArray(16, "<i4", 0x9000), "send is float32 but receive is int32"),
    (DeviceArray(16, ptr=0x1000), DeviceArray(16, ptr=0x1020), "must not overlap"),
    ("x", DeviceArray(16), "all_to_all: send buffer"),
])
def test_all_to_all_refuses_buffers_that_do_not_split_into_blocks(nccl, send, recv, says):
    from shimrt.nccl import alltoall
    with pytest.raises(UsageError, match=re.escape(says)):
        alltoall.block_calls(_comm_stand_in(nccl, 4), send, recv, None)


def test_torch_reduce_ops_and_timedeltas_are_taken():
    torch = pytest.importorskip("torch")
    import datetime

    from shimrt.stream import timeout_seconds
    dist = torch.distributed
    row = COLLECTIVES["all_reduce"]
    for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.PRODUCT, "prod"), (dist.ReduceOp.MAX, "max"),
                     (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.AVG, "avg")):
        assert comm_mod.op_of("all_reduce", row, op) == library.REDOPS[name]
    with pytest.raises(UsageError, match="not ReduceOp.BAND"):
        comm_mod.op_of("all_reduce", row, dist.ReduceOp.BAND)
    assert timeout_seconds(datetime.timedelta(minutes=2)) == 120.0
    with pytest.raises(UsageError, match="timeout must be a finite positive number, not 0.0"):
        timeout_seconds(datetime.timedelta(0))


# --- a packed call --------------------------------------------------------------------------------

def test_a_packed_call_converts_once_and_reaches_nccl_as_the_prototyped_one_does(nccl):
    """Library.packed: every argument of its C type (a pointer above 4 GiB kept whole, the enums
    as C ints), the function bound without a prototype, and NCCL's own answer unchanged: on a
    NULL communicator both the packed and the prototyped ncclAllReduce say ncclInvalidArgument."""
    high = 0x7F12_3456_7000  # a device address above 32 bits: must not be cut to a C int
    fn, args = nccl.packed("ncclAllReduce", (high, high, 2, 7, 0, ctypes.c_void_p(None), 0x5678))
    assert fn.argtypes is None and fn.restype is ctypes.c_int
    assert nccl.ncclAllReduce.argtypes is not None, "the prototyped function keeps its prototype"
    assert [type(a) for a in args] == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, int, int,
                                       ctypes.c_void_p, ctypes.c_void_p]
    assert args[0].value == high and args[2].value == 2 and args[6].value == 0x5678
    assert fn(*args) == nccl.ncclAllReduce(high, high, 2, 7, 0, None, 0x5678) == 4  # ncclInvalidArgument
    assert nccl.packed("ncclAllReduce", args)[0] is fn, "one bare function per name"
    with pytest.raises(UsageError, match="ncclAllReduce takes 7 arguments, not 6"):
        nccl.packed("ncclAllReduce", args[:6])
    with pytest.raises(UsageError, match="is not an NCCL function shimrt binds"):
        nccl.packed("ncclNoSuchCall", ())
