"""Launches on a real GPU, every output element checked against numpy on fresh random data."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import shimrt
from shimrt import UsageError, kernels

# Kernels compiled without FMA contraction, so float results equal numpy's bit for bit.
EXACT = ["--fmad=false"]


@pytest.fixture(scope="module")
def vec(device):
    return device.load(device.compile(kernels.source("vector_ops"), options=EXACT, name="vector_ops.cu"))


def test_target_from_device_attributes(device):
    t = device.target
    assert t.backend == "cuda" and t.arch.startswith("sm_")
    assert t.num_sms > 0 and t.warp_size == 32
    if "H200" in device.name:
        # shared/notes/h200-measurements.md: the device attributes read on an H200.
        smem = (t.smem_per_sm, t.smem_per_block_optin, t.reserved_smem_per_block)
        assert t.num_sms == 132 and smem == (233472, 232448, 1024)
        assert (t.max_threads_per_sm, t.max_blocks_per_sm, t.regs_per_sm) == (2048, 32, 65536)
        profile = shimrt.targets.get("H200")
        assert t.with_(name=profile.name) == profile


def test_saxpy_float32_and_int32_scalars(device, vec, rng):
    n = 1_000_003
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    for a in (np.float32(rng.standard_normal()), float(rng.standard_normal())):
        dx, dy = device.to_device(x), device.to_device(y)
        vec["saxpy"].launch(264, 256, dy, dx, a, n)
        np.testing.assert_array_equal(dy.numpy(), np.float32(a) * x + y)


def test_add_int64_with_python_int_count(device, vec, rng):
    n = 300_001
    a = rng.integers(-2**62, 2**62, n, dtype=np.int64)
    b = rng.integers(-2**62, 2**62, n, dtype=np.int64)
    out = device.empty(n, np.int64).memset(0xFF)
    vec["add_i64"].launch(100, 128, out, device.to_device(a), device.to_device(b), n)
    np.testing.assert_array_equal(out.numpy(), a + b)


def test_affine_float64_python_floats_and_unsigned_count(device, vec, rng):
    n = 123_457
    x = rng.standard_normal(n)
    s, t = float(rng.standard_normal()), float(rng.standard_normal())
    dx = device.to_device(x)
    vec["affine_f64"].launch((50, 1, 1), (256, 1, 1), dx, s, t, np.uint32(n))
    np.testing.assert_array_equal(dx.numpy(), x * s + t)


def test_block_sum_static_smem_and_launch_bounds(device, rng):
    module = device.load(device.compile(kernels.source("reduce"), name="reduce.cu"))
    k = module["block_sum"]
    assert k.attributes["static_smem"] == module.program.resources["block_sum"].static_smem == 2048
    assert k.attributes["max_threads_per_block"] <= 256
    n, blocks = 1 << 20, 64
    x = rng.standard_normal(n, dtype=np.float32)
    out = device.empty(blocks, np.float64)
    k.launch(blocks, 256, out, device.to_device(x), n)
    # block b sums elements i with (i // 256) % blocks == b
    want = x.astype(np.float64).reshape(-1, blocks, 256).sum(axis=(0, 2))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-9)


def test_dynamic_smem_above_48k_is_opted_in(device, rng):
    k = device.load(device.compile(kernels.source("smem_ops"), name="smem_ops.cu"))["reverse_tiles"]
    for smem in (48 * 1024, 64 * 1024, 160 * 1024, device.target.smem_per_block_optin):
        tile, blocks = smem // 4, 3 * device.target.num_sms
        x = rng.standard_normal(tile * blocks, dtype=np.float32)
        out = device.empty(x.shape, np.float32).memset(0)
        k.launch(blocks, 1024, out, device.to_device(x), tile, dynamic_smem=smem)
        np.testing.assert_array_equal(out.numpy(), x.reshape(blocks, tile)[:, ::-1].ravel())
    assert k.device.driver.function_attributes(k.handle)["max_dynamic_smem"] >= device.target.smem_per_block_optin


def test_dynamic_smem_above_device_limit_is_refused_before_launch(device):
    k = device.load(device.compile(kernels.source("smem_ops"), name="smem_ops.cu"))["reverse_tiles"]
    out = device.empty(16, np.float32).memset(0x7F)
    with pytest.raises(UsageError, match="exceeds the device"):
        k.launch(1, 32, out, out, 4, dynamic_smem=device.target.smem_per_block_optin + 16)
    assert (out.numpy().view(np.uint8) == 0x7F).all()


# shared/notes/h200-measurements.md: cuOccupancyMaxActiveBlocksPerMultiprocessor for an 18-register
# kernel on an H200, by threads per block and dynamic smem in KiB.
NOTES_KIB = [0, 16, 24, 28, 32, 40, 48, 64, 76, 113, 114, 227]
NOTES_TABLE = {128: [16, 13, 9, 7, 6, 5, 4, 3, 2, 2, 1, 1],
               256: [8, 8, 8, 7, 6, 5, 4, 3, 2, 2, 1, 1],
               512: [4, 4, 4, 4, 4, 4, 4, 3, 2, 2, 1, 1]}


def test_max_active_blocks_reproduces_the_notes_table(device):
    if "H200" not in device.name:
        pytest.skip(f"the table was measured on an H200, this is {device.name}")
    k = device.load(device.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    assert k.attributes["registers"] == 18
    got = {bs: [k.max_active_blocks(bs, kib * 1024) for kib in NOTES_KIB] for bs in NOTES_TABLE}
    assert got == NOTES_TABLE


def test_max_active_blocks_sweep_follows_shared_memory(device):
    k = device.load(device.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    t = device.target
    for smem in range(0, t.smem_per_block_optin + 1, 4096):
        per_block = -(-(smem + k.attributes["static_smem"]) // t.smem_alloc_unit) * t.smem_alloc_unit
        by_smem = t.smem_per_sm // (per_block + t.reserved_smem_per_block)
        want = min(by_smem, t.max_blocks_per_sm, t.max_threads_per_sm // 128)
        assert k.max_active_blocks(128, smem) == want, smem


def test_stream_priorities_read_back(device):
    least, greatest = device.priority_range
    assert greatest < least
    with device.stream("high") as hi, device.stream("low") as lo, device.stream() as default:
        assert (hi.priority, lo.priority, default.priority) == (greatest, least, least)
    for p in range(greatest, least + 1):
        with device.stream(p) as s:
            assert s.priority == p
    for bad in (greatest - 1, least + 1, "highest", 1.5, True):
        with pytest.raises(UsageError):
            device.stream(bad)


def test_events_time_a_spinning_kernel_and_order_streams(device):
    module = device.load(device.compile(kernels.source("probe"), name="probe.cu"))
    k = module["sm_probe"]
    blocks = 4
    sm, start, stop = (device.empty(blocks, np.uint32), device.empty(blocks, np.uint64),
                       device.empty(blocks, np.uint64))
    spin_ns = 2_000_000
    marker = device.empty(blocks, np.uint64).memset(0)
    with device.stream("low") as s1, device.stream("high") as s2:
        e0 = s1.record()
        k.launch(blocks, 32, sm, start, stop, spin_ns, stream=s1)
        e1 = s1.record()
        s2.wait(e1)
        marker.copy_from(stop, stream=s2)  # ordered after the kernel through the event
        e1.synchronize(timeout=10)
        assert e0.elapsed_ms(e1) >= 0.9 * spin_ns / 1e6
        np.testing.assert_array_equal(marker.numpy(), stop.numpy())
    ticks = stop.numpy() - start.numpy()
    assert (ticks >= spin_ns).all()
    assert (sm.numpy() < device.target.num_sms).all()


def test_synchronize_with_timeout_raises_instead_of_hanging(device):
    k = device.load(device.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    bufs = (device.empty(1, np.uint32), device.empty(1, np.uint64), device.empty(1, np.uint64))
    with device.stream() as s:
        # Each wait its own 2 s of spinning, which a 0.05-s wait ends before. Full-suite runs on an
        # H100 twice saw the device's wait return (at 71ad7d8, where both waits shared one kernel)
        # where it passed alone. A likely cause: the collector, run on this thread between the launch
        # and the wait, finalizing an earlier test's buffers and modules, whose cuMemFree and
        # cuModuleUnload may wait for the device: the thread stalls until the kernel ends, and the wait
        # then rightly finds nothing left. So the collector runs before the launch and not during
        # the wait; a wait that still returns says how long it took by the host's clock and whether
        # the kernel was still running then (which no stall explains).
        for wait in (s.synchronize, device.synchronize):  # the device's: the work is on a non-blocking stream
            gc.collect()
            gc.disable()
            try:
                k.launch(1, 32, *bufs, 2_000_000_000, stream=s)
                t0 = time.monotonic()
                try:
                    wait(timeout=0.05)
                except shimrt.ShimrtError as exc:
                    assert "did not finish within" in str(exc), exc
                else:
                    took, running = time.monotonic() - t0, not s.query()
                    contexts = _contexts(device, s)  # before the wait below: as they were when it returned
                    s.synchronize(timeout=30)
                    spun = int(bufs[2].numpy()[0] - bufs[1].numpy()[0]) / 1e9
                    pytest.fail(f"{wait.__qualname__}(timeout=0.05) returned after {took:.3f} s, the kernel "
                                f"{'still running' if running else 'done'}; it spun {spun:.3f} s of 2; {contexts}")
            finally:
                gc.enable()
            s.synchronize(timeout=30)
        device.synchronize(timeout=30)


def _contexts(device, stream) -> str:
    """Where ``stream`` lives against the device's primary context (the one Device synchronizes)
    and the thread's current one (CUDA): a stream made in another context is not waited for."""
    if device.backend != "cuda":
        return "contexts not read on this backend"
    from cuda.bindings import driver as cu
    _, of_stream = cu.cuStreamGetCtx(stream.ref())
    _, current = cu.cuCtxGetCurrent()
    _, dev = cu.cuDeviceGet(device.index)
    _, primary = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuDevicePrimaryCtxRelease(dev)
    return (f"the stream's context {int(of_stream):#x}, the device's primary {int(primary):#x}, the thread's "
            f"current {int(current):#x}")


def test_torch_tensor_arguments_and_dlpack(device, vec, rng):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    n = 65_537
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    tx, ty = torch.from_numpy(x).cuda(device.index), torch.from_numpy(y).cuda(device.index)
    torch.cuda.synchronize()
    vec["saxpy"].launch(64, 256, ty, tx, np.float32(3.0), n)
    device.synchronize()
    np.testing.assert_array_equal(ty.cpu().numpy(), np.float32(3.0) * x + y)
    buf = device.to_device(x)
    t = torch.from_dlpack(buf)
    assert t.data_ptr() == buf.ptr and t.dtype == torch.float32 and tuple(t.shape) == (n,)
    np.testing.assert_array_equal(t.cpu().numpy(), x)
    t.mul_(2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(buf.numpy(), x * 2)


def test_cupy_array_arguments_and_interfaces(device, vec, rng):
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    n = 70_001
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    cx, cy = cp.asarray(x), cp.asarray(y)
    cp.cuda.runtime.deviceSynchronize()
    vec["saxpy"].launch(64, 256, cy, cx, -0.5, n)
    device.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(cy), np.float32(-0.5) * x + y)
    buf = device.to_device(y)
    via_cai = cp.asarray(buf)
    assert via_cai.data.ptr == buf.ptr
    np.testing.assert_array_equal(cp.asnumpy(via_cai), y)
    via_dlpack = cp.from_dlpack(buf)
    assert via_dlpack.data.ptr == buf.ptr
    np.testing.assert_array_equal(cp.asnumpy(via_dlpack), y)


def test_bad_launches_are_clear_errors_and_launch_nothing(device, vec):
    out = device.empty(8, np.float32).memset(0x7F)
    k = vec["saxpy"]
    cases = [
        ((1, 32, out, out, 1.0), "takes 4 arguments"),                        # missing count
        ((1, 32, out, out, 1.0, 8, 9), "takes 4 arguments"),                  # too many
        ((1, 32, out, "x", 1.0, 8), "cannot pass str"),                       # wrong type
        ((1, 32, out, np.zeros(8, np.float32), 1.0, 8), "lives on the host"),  # host array
        ((1, 32, out, out, np.float64(1.0), 8), "is 8 bytes but"),            # wrong scalar width
        ((1, 32, out, out, 1.0, 2**40), "does not fit"),                       # int32 overflow
        ((1, 2048, out, out, 1.0, 8), "exceeds its limit"),                   # block too big
        ((1, 32.0, out, out, 1.0, 8), "block must be an int"),                # float block
        ((1.0, 32, out, out, 1.0, 8), "grid must be an int"),                 # float grid
        ((0, 32, out, out, 1.0, 8), "must be positive"),                       # empty grid
        (((1, 70000), 32, out, out, 1.0, 8), "exceeds the limits"),            # grid y too big
    ]
    for args, message in cases:
        with pytest.raises(UsageError, match=message):
            k.launch(*args)
    with pytest.raises(UsageError, match="smem must be"):
        k.launch(1, 32, out, out, 1.0, 8, dynamic_smem=0.5)
    with pytest.raises(UsageError, match="no kernel 'nope'"):
        vec["nope"]
    assert (out.numpy().view(np.uint8) == 0x7F).all()


def test_program_for_another_arch_is_refused(device):
    other = "sm_80" if device.target.arch != "sm_80" else "sm_90"
    program = shimrt.compile(kernels.source("vector_ops"), other, name="vector_ops.cu")
    if device.target.compute_capability[0] == 8 and other == "sm_80":
        device.load(program)  # sm_80 code runs on any 8.x
    else:
        with pytest.raises(UsageError, match="compile for device.target"):
            device.load(program)


def test_closed_objects_are_errors_not_crashes(device):
    module = device.load(device.compile(kernels.source("vector_ops"), name="vector_ops.cu"))
    k = module["empty"]
    buf = device.alloc(64)
    module.close()
    with pytest.raises(UsageError, match="module is closed"):
        k.launch(1, 32, buf)
    s = device.stream()
    s.close()
    with pytest.raises(UsageError, match="closed"):
        s.synchronize()
    buf.free()
    with pytest.raises(UsageError, match="freed"):
        buf.numpy()


def test_bad_device_index_is_no_device_error(device):
    with pytest.raises(shimrt.NoDeviceError, match="does not exist"):
        shimrt.Device(999)


def test_objects_left_open_are_freed_quietly_at_exit(device):
    script = textwrap.dedent("""
        import numpy as np, shimrt
        dev = shimrt.Device()
        m = dev.load(dev.compile(shimrt.kernels.source("vector_ops"), name="vector_ops.cu"))
        s = dev.stream("high"); e = s.record(); b = dev.to_device(np.arange(1000, dtype=np.float32))
        m["empty"].launch(1, 32, b, stream=s)
        keep = [m, s, e, b, dev]
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok" and run.stderr == ""


def test_launches_from_other_threads(device, vec, rng):
    import threading
    n = 50_000
    xs = [rng.standard_normal(n, dtype=np.float32) for _ in range(4)]
    outs = [device.to_device(np.zeros(n, np.float32)) for _ in xs]
    ins = [device.to_device(x) for x in xs]
    errors = []

    def work(i):
        try:
            # The first call on this thread is a launch: no context is current here yet.
            vec["saxpy"].launch(32, 256, outs[i], ins[i], 1.0, n)
            device.synchronize()
            with device.stream() as s:
                for _ in range(49):
                    vec["saxpy"].launch(32, 256, outs[i], ins[i], 1.0, n, stream=s)
                s.synchronize()
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for x, out in zip(xs, outs, strict=True):
        want = np.zeros(n, np.float32)
        for _ in range(50):
            want = np.float32(1.0) * x + want
        np.testing.assert_array_equal(out.numpy(), want)


def test_prepared_launch_repeats_with_the_same_checks(device, vec, rng):
    n = 10_000
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    dx, dy = device.to_device(x), device.to_device(y)
    with device.stream("high") as s:
        run = vec["saxpy"].prepare((8, 1), 256, dy, dx, 0.5, n, stream=s)
        for _ in range(3):
            run()
        s.synchronize()
    want = y
    for _ in range(3):
        want = np.float32(0.5) * x + want
    np.testing.assert_array_equal(dy.numpy(), want)
    with pytest.raises(UsageError, match="takes 4 arguments"):
        vec["saxpy"].prepare(8, 256, dy, dx, 0.5)
    with pytest.raises(UsageError, match="exceeds its limit"):
        vec["saxpy"].prepare(8, 4096, dy, dx, 0.5, n)
