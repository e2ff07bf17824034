"""Run under python -m shimrt.launch by tests/test_launch.py; needs neither a GPU nor NCCL unless asked.

Modes (argv[1]):
  env                  print the launch variables and launch_env() as one JSON line
  sleep DIR            write this rank's pid and its child's (a sleeping grandchild of the launcher)
                       to DIR/rank-<r>.json, then sleep
  stubborn DIR         the same, ignoring SIGTERM (only SIGKILL stops it)
  leaky DIR            the same, but only the child ignores SIGTERM: the rank itself obeys it
  exit CODE RANK       rank RANK exits with CODE once every rank is up; the others sleep
  kill-self RANK       rank RANK kills itself with SIGKILL; the others sleep
  no-nccl              print RAN and whether the launcher passed an id or why not; never calls init()
  rendezvous           call shimrt.launch.rendezvous() and print the outcome (exit 1 on an error)
  init                 call shimrt.launch.init() and print the outcome (exit 1 on an error)
"""
import json
import os
import signal
import subprocess
import sys
import time

from shimrt.config import launch_env

mode = sys.argv[1]
rank = int(os.environ["SHIMRT_RANK"])


def write_pids(folder: str, child_ignores_sigterm: bool = False) -> None:
    ready = os.path.join(folder, f"child-{rank}.ready")
    code = "import time\n"
    if child_ignores_sigterm:
        code += f"import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen({ready!r}, 'w').close()\n"
    child = subprocess.Popen([sys.executable, "-c", code + "time.sleep(120)"])
    while child_ignores_sigterm and not os.path.exists(ready):
        time.sleep(0.01)
    path = os.path.join(folder, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": os.getpid(), "child": child.pid}, f)
    os.replace(path + ".tmp", path)  # the test never reads half a file


if mode == "env":
    names = ["SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SHIMRT_NCCL_UNIQUE_ID_ERROR",
             "SHIMRT_DEVICES"]
    env = launch_env()
    print(json.dumps({"vars": {n: os.environ.get(n) for n in names},
                      "has_unique_id": "SHIMRT_NCCL_UNIQUE_ID" in os.environ,
                      "launch_env": {"source": env.source, "rank": env.rank, "world_size": env.world_size,
                                     "local_rank": env.local_rank, "local_world_size": env.local_world_size},
                      "device": env.device}))
elif mode in ("sleep", "stubborn", "leaky"):
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_pids(sys.argv[2], child_ignores_sigterm=mode == "leaky")
    time.sleep(120)
elif mode == "exit":
    code, who = int(sys.argv[2]), int(sys.argv[3])
    if rank == who:
        time.sleep(0.5)  # the others are up by now: there is someone to stop
        sys.exit(code)
    time.sleep(120)
elif mode == "kill-self":
    if rank == int(sys.argv[2]):
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
elif mode == "no-nccl":
    env = launch_env()
    print("RAN", rank, "id" if env.unique_id else "no-id", "error" if env.unique_id_error else "no-error", flush=True)
elif mode in ("rendezvous", "init"):
    import shimrt
    from shimrt import launch
    try:
        if mode == "rendezvous":
            r = launch.rendezvous()
            print("RENDEZVOUS", r.rank, r.world_size, len(r.unique_id))
        else:
            comm = launch.init()
            print("JOINED", comm.rank, comm.size)
            comm.close()
    except shimrt.NoDeviceError as exc:
        print("NO-DEVICE", str(exc).splitlines()[0])
    except shimrt.CollectiveError as exc:
        print("COLLECTIVE-ERROR", exc, flush=True)
        sys.exit(1)
else:
    sys.exit(f"launch_probe.py: unknown mode {mode!r}")
