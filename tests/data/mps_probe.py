"""Run under python -m shimrt.launch --mps by tests/test_mps.py and tests/gpu/test_mps_gpu.py.

Modes (argv[1]):
  env                  print, as one JSON line, the MPS variables this rank got, launch_env().mps,
                       and whether the launcher's daemon answers this rank (its pid from the pid file)
  sleep DIR            write this rank's pid, the daemon's and its folders to DIR/rank-<r>.json, then sleep
  exit CODE RANK       rank RANK exits with CODE once every rank is up; the others sleep
  context-fails RANK   rank RANK prints "FAILING <time.time()>", then meets CUDA_ERROR_DEVICE_UNAVAILABLE
                       where launch.init() opens its GPU (the Device is replaced by one that raises it,
                       as an MPS server that does not take the client makes the driver do) and lets
                       the error end it; the others sleep
  collectives          (GPU) every collective of tests/data/multirank_probe.py, each element checked
                       ("OK <rank> <name>" lines), then the daemon's server list ("SERVERS <rank> <pids>")
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from shimrt.config import launch_env
from shimrt.launch import mps

mode = sys.argv[1]
rank = int(os.environ["SHIMRT_RANK"])
PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")


def ask(command: str, tries: int = 5) -> tuple[int, str]:
    """The launcher's daemon's answer to ``command``, asked from this rank's environment; asked
    again, up to ``tries`` times, where the control program fails: on an H100 (71ad7d8) one of two
    ranks asking at once got exit status 1 and no answer while the other got its answer."""
    for _ in range(tries):
        done = subprocess.run([mps.find_control()], input=command + "\n", capture_output=True, text=True, timeout=20)
        if done.returncode == 0:
            break
        time.sleep(0.2)
    said = done.stdout if done.returncode == 0 else f"status {done.returncode}: {done.stdout} {done.stderr}"
    return done.returncode, " ".join(said.split())  # one pid a line, if several


def daemon_pid():
    try:
        return int(Path(PIPE, mps.PID_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return None


if mode == "env":
    code, said = ask("get_default_active_thread_percentage")
    print(json.dumps({"pipe": PIPE, "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY"),
                      "mark": os.environ.get("SHIMRT_MPS"), "launch_env_mps": launch_env().mps,
                      "answers": code == 0 and said == "100.0", "daemon": daemon_pid()}), flush=True)
elif mode == "sleep":
    path = os.path.join(sys.argv[2], f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": os.getpid(), "daemon": daemon_pid(), "pipe": PIPE,
                   "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}, f)
    os.replace(path + ".tmp", path)  # the test never reads half a file
    time.sleep(120)
elif mode == "exit":
    if rank == int(sys.argv[3]):
        time.sleep(0.5)  # the others are up by now: there is someone to stop
        sys.exit(int(sys.argv[2]))
    time.sleep(120)
elif mode == "context-fails":
    if rank == int(sys.argv[2]):
        import shimrt.device
        from shimrt import DriverError, launch

        class Unavailable:
            def __init__(self, *args, **kwargs):
                raise DriverError("cuDevicePrimaryCtxRetain", "CUDA_ERROR_DEVICE_UNAVAILABLE", 46,
                                  "CUDA-capable device(s) is/are busy or unavailable")

        shimrt.device.Device = Unavailable
        time.sleep(0.5)
        print(f"FAILING {time.time()}", flush=True)
        launch.init()  # raises: the rank ends with the error, as a real script would
    time.sleep(120)
elif mode == "collectives":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import multirank_probe

    from shimrt.launch import init
    comm = init()
    try:
        for name in multirank_probe.every_collective([comm]):
            print(f"OK {comm.rank} {name}", flush=True)
    finally:
        comm.close()
    code, said = ask("get_server_list")  # a server runs while its clients do: MPS really served them
    print(f"SERVERS {rank} {said if code == 0 else 'error: ' + said}", flush=True)
else:
    sys.exit(f"mps_probe.py: unknown mode {mode!r}")
