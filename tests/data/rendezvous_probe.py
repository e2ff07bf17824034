"""Run under python -m shimrt.launch by tests/test_launch.py: report the rendezvous, then try
to join the communicator (which needs a GPU)."""
import json
import sys

import shimrt
from shimrt import launch

r = launch.rendezvous()
print(json.dumps({"rank": r.rank, "world_size": r.world_size, "local_rank": r.local_rank,
                  "unique_id": r.unique_id.hex(), "source": r.source}))
if len(sys.argv) > 1 and sys.argv[1] == "fail-rank-1" and r.rank == 1:
    sys.exit(3)
if len(sys.argv) > 1 and sys.argv[1] == "fail-rank-1":
    import time
    time.sleep(120)
try:
    comm = launch.init()
except shimrt.NoDeviceError as exc:
    print("NO-DEVICE", str(exc).splitlines()[0])
else:
    print("JOINED", comm.rank, comm.size)
    comm.close()
