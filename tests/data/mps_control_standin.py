"""A stand-in for NVIDIA's nvidia-cuda-mps-control, for the CPU tests of shimrt.launch.mps and the
launcher's --mps: the thing under test is how shimrt starts, checks, stops and cleans up after
the vendor's daemon, which needs a GPU machine. The tests copy this file to a folder as
``nvidia-cuda-mps-control`` (with a ``#!`` line naming their Python) and point
SHIMRT_MPS_CONTROL at it.

It behaves as the real program does in what shimrt relies on:
  -d     becomes a daemon (fork, new session, output to /dev/null) and returns at once; the
         daemon writes its pid to $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid, listens
         on the Unix socket $CUDA_MPS_PIPE_DIRECTORY/control, logs to
         $CUDA_MPS_LOG_DIRECTORY/control.log, and serves one command per connection
  (none) client: sends each line of stdin to the daemon and prints the answers; without a daemon
         it prints "Cannot find MPS control daemon process" and exits 1
Commands: get_server_list (no servers: prints nothing), get_default_active_thread_percentage,
quit (the daemon exits), anything else "Invalid command".

Misbehaviour on demand, for the tests of shimrt's refusals (environment of ``-d``):
  MPS_STANDIN_FAIL_START=1   -d prints why and exits 1 (as without a usable driver)
  MPS_STANDIN_SILENT=1       the daemon runs but never opens its socket (never answers)
  MPS_STANDIN_IGNORE_QUIT=1  the daemon answers quit but keeps running
"""
import os
import socket
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
SOCKET = os.path.join(PIPE, "control")


def log(text: str) -> None:
    try:
        with open(os.path.join(LOG, "control.log"), "a") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} Control {os.getpid()}] {text}\n")
    except OSError:
        pass


def serve() -> None:
    with open(os.path.join(PIPE, "nvidia-cuda-mps-control.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    if os.environ.get("MPS_STANDIN_SILENT") == "1":
        log("Staying silent (MPS_STANDIN_SILENT)")
        time.sleep(300)
        return
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(SOCKET)
    server.listen(8)
    log(f"Starting control daemon using socket {SOCKET}")
    while True:
        conn, _ = server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            command = data.decode().strip()
            log(f"NEW UI: {command}")
            if command == "get_server_list":
                answer = ""
            elif command == "get_default_active_thread_percentage":
                answer = "100.0"
            elif command == "quit":
                answer = ""
                if os.environ.get("MPS_STANDIN_IGNORE_QUIT") != "1":
                    conn.sendall(answer.encode())
                    log("Exit")
                    os.unlink(SOCKET)
                    os.unlink(os.path.join(PIPE, "nvidia-cuda-mps-control.pid"))
                    return
                log("Ignoring quit (MPS_STANDIN_IGNORE_QUIT)")
            else:
                answer = "Invalid command"
            conn.sendall(answer.encode())


def daemonize() -> None:
    if os.environ.get("MPS_STANDIN_FAIL_START") == "1":
        print("standin: cannot start the MPS control daemon: no usable GPU driver (MPS_STANDIN_FAIL_START)")
        sys.exit(1)
    if os.fork() > 0:
        return  # the caller's -d returns at once, before the daemon listens
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        serve()
    finally:
        os._exit(0)


def client() -> int:
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET)
        except OSError:
            print("Cannot find MPS control daemon process")
            return 1
        with sock:
            sock.sendall(line.strip().encode() + b"\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        if answer:
            print(answer.decode())
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["-d"]:
        daemonize()
    elif sys.argv[1:]:
        print(f"standin: unknown arguments {sys.argv[1:]}")
        sys.exit(2)
    else:
        sys.exit(client())
