"""Where does Kernel.launch spend its time on this machine? (a diagnostic, not a benchmark)

Times batches of 200 launches (below the launch-queue depth), stream drained between batches,
median per launch, variants interleaved.
"""
import ctypes, statistics, struct, sys, time
sys.path.insert(0, ".")
import shimrt
from cuda.bindings import driver
dev = shimrt.Device()
k = dev.load(dev.compile(shimrt.kernels.source("vector_ops"), name="vector_ops.cu"))["empty"]
buf = dev.alloc(4); s = dev.stream()
k.launch(1, 32, buf, stream=s); s.synchronize()
fn, h = k._fn, s._handle
v = ctypes.c_uint64(buf.ptr); arr = (ctypes.c_void_p * 1)(ctypes.addressof(v)); addr = ctypes.addressof(arr)
view, kaddr = k._local.block
raw = driver.cuLaunchKernel
put = struct.Struct("<Q").pack_into
def wrap(): return raw(fn, 1, 1, 1, 32, 1, 1, 0, h, addr, 0)
def wrap_put(): put(view, 0, buf.device_pointer); return raw(fn, 1, 1, 1, 32, 1, 1, 0, h, kaddr, 0)
variants = {
    "raw pre-packed": lambda n: [raw(fn, 1, 1, 1, 32, 1, 1, 0, h, addr, 0) for _ in range(n)],
    "raw with the kernel's block": lambda n: [raw(fn, 1, 1, 1, 32, 1, 1, 0, h, kaddr, 0) for _ in range(n)],
    "python wrapper around raw": lambda n: [wrap() for _ in range(n)],
    "wrapper + pack pointer": lambda n: [wrap_put() for _ in range(n)],
    "Kernel.launch": lambda n: [k.launch(1, 32, buf, stream=s) for _ in range(n)],
    "Kernel.launch null stream": lambda n: [k.launch(1, 32, buf) for _ in range(n)],
    "raw null stream": lambda n: [raw(fn, 1, 1, 1, 32, 1, 1, 0, 0, addr, 0) for _ in range(n)],
}
times = {name: [] for name in variants}
for _ in range(100):
    for name, f in variants.items():
        dev.synchronize(); t0 = time.perf_counter(); f(200); times[name].append((time.perf_counter() - t0) / 200 * 1e9)
for name, ts in times.items():
    print(f"{name:32s} {statistics.median(ts):8.0f} ns")
