"""Run under a launcher by the tests: report the rendezvous, then try to join the communicator.

Modes (argv[1]): "rendezvous-only"; "fail-rank-1" (rank 1 exits with 3, rank 0 sleeps);
otherwise join with a 20 s timeout, so a missing peer ends in an error, not a hang.
"""
import json
import sys
import time

import shimrt
from shimrt import launch
from shimrt.nccl import CommOptions

mode = sys.argv[1] if len(sys.argv) > 1 else "join"
r = launch.rendezvous()
print(json.dumps({"rank": r.rank, "world_size": r.world_size, "local_rank": r.local_rank,
                  "unique_id": r.unique_id.hex(), "source": r.source}), flush=True)
if mode == "rendezvous-only":
    sys.exit(0)
if mode == "fail-rank-1":
    if r.rank == 1:
        sys.exit(3)
    time.sleep(120)
t0 = time.monotonic()
try:
    comm = launch.init(options=CommOptions(timeout=20))
except shimrt.NoDeviceError as exc:
    print("NO-DEVICE", str(exc).splitlines()[0])
except shimrt.CollectiveError as exc:
    print(f"GAVE-UP after {time.monotonic() - t0:.1f} s:", str(exc).splitlines()[0])
else:
    print("JOINED", comm.rank, comm.size)
    comm.close()
