"""Does cuda-bindings let go of the GIL in a blocking driver call? A thread counts while the main
thread waits in cuCtxSynchronize on queued memsets (a diagnostic for the GPU machine)."""
import threading
import time

import numpy as np
from cuda.bindings import driver

from shimrt import Device

dev = Device()
buf = dev.empty(1 << 30, np.uint8)
count, stop = [0], threading.Event()


def spin():
    while not stop.is_set():
        count[0] += 1


t = threading.Thread(target=spin)
t.start()
for _ in range(300):
    buf.memset(1)
before, t0 = count[0], time.perf_counter()
err, = driver.cuCtxSynchronize()
ms, during = (time.perf_counter() - t0) * 1e3, count[0] - before
stop.set()
t.join()
print(f"cuCtxSynchronize {err} took {ms:.1f} ms; the other thread counted {during} meanwhile "
      f"({'GIL released' if during > 1000 else 'GIL HELD'})")
