import numpy as np
from shimrt.device import Device
from shimrt.overlap.engine import Engine, Schedule
from shimrt.overlap import planner
from shimrt.overlap.standin import CommStandIn, StandInSpec
from shimrt.overlap.workloads import ComputeSpec, ComputeWorkload
dev = Device(0)
c = ComputeWorkload(dev, ComputeSpec("sgemm", 4096))
a = CommStandIn(dev, StandInSpec(nbytes=443 << 20, blocks=16, threads=512, link_gbps=25.0))
e = Engine(dev, Schedule.pair(c, a), repeats=5)
tc, ta = e.alone(); print(f"T_comp {tc:.3f} T_comm(512) {ta:.3f} pace floor {a.spec.steps * a.spec.step_ns() / 1e6:.3f}")
for th in (512, 384, 256, 128):
    ch = planner.Choice("priority", comm_priority="high", comm_threads=th)
    alone = np.median([t.makespan for t in e.run(ch, only="comm")])
    both = e.run(ch)
    ms = np.median([t.makespan for t in both]); sl = np.median([t.compute.length for t in both]) / tc
    cm = np.median([t.comm.length for t in both])
    print(f"threads {th}: comm alone {alone:.3f} ms; beside sgemm makespan {ms:.3f} (R {ms/max(tc,ta):.3f}) comm {cm:.3f} compute slowdown {sl:.3f}")
e.close()
