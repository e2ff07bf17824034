"""Compute beside communication: the overlap engine.

- :mod:`.planner`: policies and choices from the occupancy model (pure, no GPU);
- :mod:`.engine`: schedules of compute launches and collectives run under a choice, timed on
  the device; :mod:`.metrics`: the arithmetic of its reports;
- :mod:`.workloads`: compute kernels (SGEMM, bias+GELU, softmax, layernorm);
- :mod:`.standin`: a collective with NCCL's footprint for one GPU; :mod:`.collective`: real
  NCCL/RCCL collectives; :mod:`.footprint`: what NCCL's kernels need, measured with CUPTI.

Importing this package loads no vendor binding; the submodules that need a GPU take a Device.
"""

from .engine import Engine
from .planner import FIXED, POLICIES, Choice, Problem, candidates, plan
from .schedule import Op, Schedule

__all__ = ["Choice", "Engine", "FIXED", "Op", "POLICIES", "Problem", "Schedule", "candidates", "plan"]
