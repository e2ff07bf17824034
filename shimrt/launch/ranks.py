"""The launcher's processes: start one rank per local GPU with what it needs to join one
communicator, pass on the signals a scheduler sends, and stop and reap every rank whatever
happens (:func:`run`); with ``mps``, inside an MPS daemon of the launcher's own
(:class:`shimrt.launch.mps.Mps`), stopped after the ranks. ``python -m shimrt.launch``
(:mod:`shimrt.launch`) is its command line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Mapping, Sequence

from .. import backends, validate
from ..config import device_map, given
from ..errors import CollectiveError, ShimrtError, UsageError
from ..nccl.link import LINKS, clashes, link_env
from ..stream import timeout_seconds
from .mps import Mps

__all__ = ["GRACE_S", "FORWARDED_SIGNALS", "TIMEOUT_EXIT", "say", "run"]

#: Seconds the ranks get to exit after the signal that stops them, before SIGKILL.
GRACE_S = 5.0
#: Signals the launcher passes on to every rank (a batch scheduler sends SIGTERM).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: The launcher's exit code when --timeout ran out (as timeout(1)).
TIMEOUT_EXIT = 124


def say(message: str) -> None:
    """A line from the launcher on stderr."""
    print(f"shimrt.launch: {message}", file=sys.stderr, flush=True)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen
    pump: threading.Thread


def _pump(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        try:
            with lock:  # one line at a time, never two ranks' halves
                out.write(prefix + text + ("" if text.endswith("\n") else "\n"))
                out.flush()
        except (OSError, ValueError):  # our stdout is gone (a closed pipe): keep draining the rank's
            pass


class _Signals:
    """The signals the launcher got while it ran ranks. The handler only records them; the
    launcher's loop passes them on, so nothing is done inside a handler."""

    def __init__(self):
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}  # signal.getsignal's answer: a handler, SIG_DFL/SIG_IGN or None

    def __call__(self, signum, frame) -> None:
        self.received.append(signum)

    def __enter__(self) -> "_Signals":
        # Python lets only the main thread set handlers; run() called elsewhere does not forward.
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED_SIGNALS:
                # An ignored signal (SIGHUP under nohup, SIGINT in a background job) stays ignored.
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _unique_id() -> tuple[str | None, str | None]:
    """(the id in hex, None), or (None, why NCCL did not load here)."""
    from ..nccl import unique_id
    try:
        return unique_id().hex(), None
    except CollectiveError as exc:
        return None, str(exc)


def _rendezvous() -> dict[str, str]:
    """torch.distributed's env:// rendezvous for the ranks, as torchrun --standalone gives it:
    MASTER_ADDR 127.0.0.1 and a MASTER_PORT free on this machine now, each where the caller's
    environment does not set it (what it sets reaches the ranks as it is). No port where none can
    be had (a rank that starts torch.distributed then says MASTER_PORT is missing)."""
    set_already = given(("MASTER_ADDR", "MASTER_PORT"))
    wanted = {} if "MASTER_ADDR" in set_already else {"MASTER_ADDR": "127.0.0.1"}
    if "MASTER_PORT" not in set_already:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))  # free on every interface, where torch's store listens
                wanted["MASTER_PORT"] = str(s.getsockname()[1])
        except OSError:
            pass
    return wanted


def _rank_env(rank: int, nproc: int, uid: str | None, uid_error: str | None,
              devices: tuple[int, ...] | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if devices is not None:
        env["SHIMRT_DEVICES"] = ",".join(map(str, devices))
    # A launcher's id, error or MPS mark left in our own environment must not reach the ranks.
    env.pop("SHIMRT_NCCL_UNIQUE_ID", None)
    env.pop("SHIMRT_NCCL_UNIQUE_ID_ERROR", None)
    env.pop("SHIMRT_MPS", None)
    env.update(extra or {})
    for prefix in ("SHIMRT_", ""):  # shimrt's names, and torchrun's for torch.distributed code
        env.update({f"{prefix}RANK": str(rank), f"{prefix}WORLD_SIZE": str(nproc),
                    f"{prefix}LOCAL_RANK": str(rank), f"{prefix}LOCAL_WORLD_SIZE": str(nproc)})
    if uid is not None:
        env["SHIMRT_NCCL_UNIQUE_ID"] = uid
    else:
        env["SHIMRT_NCCL_UNIQUE_ID_ERROR"] = uid_error or "NCCL did not load in the launcher"
    env["PYTHONUNBUFFERED"] = "1"  # rank output reaches the terminal as it is printed
    return env


def _start(rank: int, nproc: int, argv: list[str], uid: str | None, uid_error: str | None,
           lock: threading.Lock, devices: tuple[int, ...] | None = None,
           extra: Mapping[str, str] | None = None) -> _Rank:
    try:
        # Its own session, as torchrun does: a terminal's Ctrl-C reaches the rank once (through
        # the launcher), and a signal to its group reaches whatever the rank started.
        proc = subprocess.Popen([sys.executable, *argv], env=_rank_env(rank, nproc, uid, uid_error, devices, extra),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise ShimrtError(f"could not start rank {rank}: {exc}") from None
    pump = threading.Thread(target=_pump, args=(proc.stdout, f"[rank {rank}] ", sys.stdout, lock), daemon=True)
    pump.start()
    return _Rank(rank, proc, pump)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the rank's process group while the rank itself has not been reaped (so
    its pid, which names the group, cannot have been reused)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _how(code: int) -> str:
    return f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"


def _watch(ranks: list[_Rank], timeout: float | None, signals: _Signals) -> tuple[int, int]:
    """Wait until every rank exits, one fails, the timeout ends or a signal comes: (the
    launcher's exit code, the signal that stops the ranks still running)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if signals.received:
            sig = signals.received[0]
            running = sum(r.proc.poll() is None for r in ranks)
            say(f"got {_signal_name(sig)}; passing it to {running} running rank(s), which get "
                 f"{GRACE_S:g} s to exit")
            return 128 + sig, sig
        codes = [r.proc.poll() for r in ranks]  # every one, so each exit is seen
        failed = [(r, c) for r, c in zip(ranks, codes, strict=True) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            running = codes.count(None)
            say(f"rank {rank.rank} {_how(code)}" + (f"; stopping the other {running} rank(s)" if running else ""))
            return (128 - code if code < 0 else code), signal.SIGTERM
        if all(c == 0 for c in codes):
            return 0, signal.SIGTERM
        if deadline is not None and time.monotonic() > deadline:
            say(f"{codes.count(None)} rank(s) still running after --timeout {timeout:g} s; stopping them")
            return TIMEOUT_EXIT, signal.SIGTERM
        time.sleep(0.05)


def _stop(ranks: list[_Rank], sig: int, signals: _Signals, grace: float = GRACE_S) -> None:
    """Pass ``sig`` to every running rank, wait up to ``grace`` seconds (less when another
    signal comes), SIGKILL what is left, and reap them all."""
    running = [r for r in ranks if r.proc.poll() is None]
    for r in running:
        _signal_group(r.proc, sig)
    seen = len(signals.received)
    end = time.monotonic() + grace
    while any(r.proc.poll() is None for r in running) and time.monotonic() < end:
        if len(signals.received) > seen:
            break  # a signal while waiting (a second Ctrl-C): no more grace
        time.sleep(0.02)
    for r in running:
        if r.proc.poll() is None:
            say(f"rank {r.rank} still running after {grace:g} s; killing it")
        # The whole group, also where the rank itself has exited: what it started and left behind
        # (ignoring the signal) goes too. Its pid was in use a moment ago, so it names no newer group.
        try:
            os.killpg(r.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for r in ranks:
        r.proc.wait()
    end = time.monotonic() + 2  # a rank's own children may hold its output open: wait a little
    for r in ranks:
        r.pump.join(max(end - time.monotonic(), 0))


def run(nproc: int, argv: Sequence[str], timeout: float | None = None,
        devices: Sequence[int] | None = None, mps: bool = False, link: str = "native") -> int:
    """Start ``nproc`` copies of ``python argv...``, one per local rank, and wait for them.
    ``devices``: the GPU of each rank (SHIMRT_DEVICES in their environment; None: rank i on GPU
    i, or what SHIMRT_DEVICES already says). ``mps``: run them as clients of an MPS daemon
    started for them (:class:`shimrt.launch.mps.Mps`; MpsError, before any rank starts, where it
    cannot be), stopped once every rank is reaped. ``link``: what their collectives cross
    (:mod:`shimrt.nccl.link`: "socket" gives each rank NCCL's variables of a host of its own).

    Stops them all when one fails, when ``timeout`` seconds pass, or when the launcher gets
    SIGTERM, SIGINT or SIGHUP (passed on to each rank; SIGKILL after :data:`GRACE_S`).
    Returns 0 when every rank exits with 0; else the first failed rank's exit code (128 + N
    for a rank killed by signal N), 124 after the timeout, or 128 + N after the launcher got
    signal N. UsageError for a bad argument. No rank (and no MPS daemon) is left running when
    it returns or raises."""
    nproc = validate.integer(nproc, "nproc", least=1, most=validate.MAX_INT32)  # NCCL's rank count: a C int
    mps = validate.boolean(mps, "mps")
    validate.one_of(link, "link", LINKS)  # refused here, before anything starts
    # the first and last ranks' variables: any NCCL_HOSTID set already differs from one of theirs
    if clash := clashes(link, {0, nproc - 1}):
        raise UsageError(f"--link {link} sets NCCL's {', '.join(clash)}, which this environment sets already "
                         f"({', '.join(f'{k}={v}' for k, v in clash.items())}): unset them, or leave the link native")
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
        raise UsageError(f"argv must be a non-empty list of strings (a script and its arguments), not {argv!r}")
    argv = [validate.text(a, "every item of argv", empty=True) for a in argv]
    if timeout is not None:
        timeout = timeout_seconds(timeout, "timeout")
    if devices is None:
        devices = device_map()  # the caller's SHIMRT_DEVICES, checked here, before any rank starts
    if devices is not None:
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
            raise UsageError(f"devices must be a list of GPU indices, one per rank, not {devices!r}")
        devices = tuple(validate.integer(d, "every item of devices", least=0) for d in devices)
        if len(devices) != nproc:
            raise UsageError(f"--devices / SHIMRT_DEVICES must name one GPU per rank ({nproc}), not "
                             f"{len(devices)}: {','.join(map(str, devices))}")
    uid, uid_error = _unique_id()
    rendezvous = _rendezvous()  # one for all the ranks
    if uid is None:
        say(f"NCCL did not load here, so a rank that calls shimrt.launch.init() will fail ({uid_error})")
    ranks: list[_Rank] = []
    lock = threading.Lock()
    daemon = Mps() if mps else None
    with _Signals() as signals:  # a signal while the daemon starts is passed on once it runs
        code, stop_with = 0, int(signal.SIGTERM)
        try:
            extra = _start_mps(daemon) if daemon is not None else None
            for rank in range(nproc):
                if signals.received:
                    break
                ranks.append(_start(rank, nproc, argv, uid, uid_error, lock, devices,
                                    {**rendezvous, **(extra or {}), **link_env(link, rank)}))
            code, stop_with = _watch(ranks, timeout, signals)
            if daemon is not None and code not in (0, TIMEOUT_EXIT) and not signals.received:
                for line in daemon.log_tail():  # a rank failed: what the MPS server saw, before it goes
                    say(line)
        finally:
            _stop(ranks, stop_with, signals)
            if daemon is not None:  # after the ranks are reaped: quit waits for its clients
                for note in daemon.stop():
                    say(note)
    return code


def _gpu_problem() -> str | None:
    """Why an MPS daemon could do nothing here (no CUDA driver, no NVIDIA GPU), or None. Loads
    the CUDA driver in the launcher, without a context and outside MPS: its own daemon's folder
    is only in the ranks' environment, and Mps.start refused any daemon the launcher's would find."""
    try:
        drv = backends.load("cuda", "driver")
        drv.init()
        count = drv.device_count()
    except Exception as exc:  # only a warning hangs on it: whatever the bindings raise is the reason
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None if count else "the CUDA driver reports no device"


def _start_mps(daemon: Mps) -> dict[str, str]:
    """Start the ranks' MPS daemon; the environment its clients need."""
    daemon.start()
    problem = _gpu_problem()
    say(f"MPS control daemon started (pid {daemon.pid}; pipes in {daemon.pipe_directory}, logs in "
        f"{daemon.log_directory}); it is stopped when the ranks end")
    if problem is not None:
        say(f"--mps: no NVIDIA GPU can be used here ({problem}), so the MPS daemon can do nothing for the ranks")
    return daemon.environment
