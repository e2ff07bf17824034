"""CUDA MPS (NVIDIA's Multi-Process Service) for ranks that share a GPU: without it two processes
on one GPU take turns on it; as clients of one MPS daemon their kernels run side by side.

:class:`Mps` starts a control daemon of its own (``nvidia-cuda-mps-control -d``, private pipe and
log folders), confirms that it answers, gives its clients' environment (:attr:`Mps.environment`),
and stops it (``quit``, SIGKILL if it does not go) and removes its folders, whatever happens.
It refuses with :class:`MpsError`, saying why and what to do, when the control program is
missing, when the daemon does not start or answer, and when a daemon already runs here (for
/tmp/nvidia-mps, CUDA_MPS_PIPE_DIRECTORY's folder, or any this user can see): two would compete
for the GPU. Every call of the control program is bounded by a timeout. Linux only (/proc).

Why past ~400 lines: finding the daemons that already run (whoever's, through /proc and the pid
files) is what the refusal and the forced stop both rest on, so it lives beside the daemon's own
lifecycle rather than in a module that would exist for this one caller.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import validate
from ..config import settings
from ..errors import DriverError, NoDeviceError, ShimrtError, UsageError

__all__ = ["MpsError", "find_control", "running", "client_error", "temp_root", "Mps"]

#: The control program's name, looked for on PATH and then in :data:`SEARCHED`.
CONTROL = "nvidia-cuda-mps-control"
#: Where NVIDIA's container images and driver packages put it, often off PATH.
SEARCHED = ("/usr/local/nvidia/bin", "/usr/bin")
#: The longest temporary folder (in bytes) that a daemon's private folders go under (:func:`temp_root`):
#: 48, and 60 more for the folder, its pipe folder and a socket's name, stay within AF_UNIX's 108.
TEMP_ROOT_MAX = 48
#: The pipe folder of a daemon (and its clients) without CUDA_MPS_PIPE_DIRECTORY.
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
#: The file in its pipe folder where a control daemon writes its pid.
PID_FILE = "nvidia-cuda-mps-control.pid"
#: Seconds for ``-d`` to return and the new daemon to answer.
START_TIMEOUT_S = 15.0
#: Seconds for one command to the control program.
QUERY_TIMEOUT_S = 5.0
#: Seconds for the daemon to exit after ``quit``, before it is killed.
STOP_TIMEOUT_S = 10.0
#: What a CUDA client meets when the MPS server does not take it (the runtime's
#: cudaErrorDevicesUnavailable is CUDA_ERROR_DEVICE_UNAVAILABLE).
CLIENT_ERRORS = ("CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA_ERROR_MPS_CONNECTION_FAILED", "CUDA_ERROR_MPS_RPC_FAILURE",
                 "CUDA_ERROR_MPS_SERVER_NOT_READY", "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
                 "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "CUDA_ERROR_MPS_CLIENT_TERMINATED")
_NOT_RUNNING = "cannot find mps control daemon"  # the control program's answer when no daemon is there
_PREFIX = "shimrt-mps-"  # of the private folders


class MpsError(ShimrtError):
    """MPS cannot be used here: the control program is missing, its daemon did not start or
    answer, or another daemon already runs."""


@dataclass(frozen=True)
class Daemon:
    """An MPS control daemon seen running: its pid (None where only its pipe folder answered),
    user, and pipe folder (None where its environment cannot be read: another user's)."""

    pid: int | None
    user: str
    pipe_directory: str | None

    def __str__(self) -> str:
        folder = self.pipe_directory or "unknown (another user's process)"
        return f"pid {self.pid if self.pid is not None else 'unknown'} (user {self.user}, pipe folder {folder})"


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_control() -> str:
    """The control program: SHIMRT_MPS_CONTROL when set (then the only one), else
    nvidia-cuda-mps-control on PATH, then in /usr/local/nvidia/bin and /usr/bin. MpsError,
    saying where it looked, when there is none."""
    override = settings().mps_control
    if override is not None:
        if not _executable(override):
            why = "not an executable file" if os.path.exists(override) else "missing"
            raise MpsError(f"SHIMRT_MPS_CONTROL must name NVIDIA's MPS control program ({CONTROL}), an executable "
                           f"file, not {override!r} ({why})")
        return os.path.abspath(override)
    found = shutil.which(CONTROL) or next(
        (p for p in (os.path.join(d, CONTROL) for d in SEARCHED) if _executable(p)), None)
    if found is None:
        raise MpsError(f"MPS is not installed here: {CONTROL} is neither on PATH nor in {' or '.join(SEARCHED)}; "
                       "install NVIDIA's compute utilities, or set SHIMRT_MPS_CONTROL to the program's path")
    return found


# --- processes, through /proc ----------------------------------------------------------------

def _proc(pid: int, name: str) -> bytes | None:
    """/proc/<pid>/<name>, or None where it cannot be read (gone, or another user's environ)."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie nobody reaped yet does not)."""
    stat = _proc(pid, "stat")
    return stat is not None and stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


def _user(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        return pwd.getpwuid(uid).pw_name
    except OSError:
        return "unknown"
    except KeyError:
        return str(uid)


def _pipe_of(pid: int) -> str | None:
    """The pipe folder process ``pid`` uses (its CUDA_MPS_PIPE_DIRECTORY, or the default); None
    where its environment cannot be read (another user's process)."""
    environ = _proc(pid, "environ")
    if environ is None:
        return None
    found = [i.partition(b"=")[2] for i in environ.split(b"\0") if i.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")]
    return found[0].decode(errors="replace") if found and found[0] else DEFAULT_PIPE_DIRECTORY


def _mps_argv(pid: int, control: str | None) -> list[str] | None:
    """The arguments of ``pid`` where it runs an MPS program (argv[0] named so, or argv[1] for a
    script run by its interpreter: a stand-in written in Python), else None."""
    argv = [a.decode(errors="replace") for a in (_proc(pid, "cmdline") or b"").split(b"\0") if a]
    names = {CONTROL} | ({os.path.basename(control)} if control else set())
    mps = any(os.path.basename(a) in names or os.path.basename(a).startswith("nvidia-cuda-mps-") for a in argv[:2])
    return argv if mps else None


def _pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Wait up to ``seconds`` for ``pids`` to end; those still running."""
    end = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def _read_pid(folder: str) -> int | None:
    try:
        text = Path(folder, PID_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _ask(control: str, env: dict[str, str], command: str, timeout: float) -> tuple[int | None, str]:
    """(exit code, what it printed) of one command to the control program; the code is None
    when it did not answer within ``timeout`` seconds or could not be run."""
    try:
        done = subprocess.run([control], input=command + "\n", capture_output=True, text=True, env=env,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, f"no answer to {command!r} within {timeout:g} s"
    except OSError as exc:
        return None, f"{control}: {exc.strerror or exc}"
    return done.returncode, " ".join((done.stdout + " " + done.stderr).split())


def _answered(code: int | None, text: str) -> bool:
    return code == 0 and _NOT_RUNNING not in text.lower()


def _client_env(pipe: str, log: str | None = None) -> dict[str, str]:
    return dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, **({"CUDA_MPS_LOG_DIRECTORY": log} if log else {}))


def running(control: str | None = None) -> list[Daemon]:
    """The MPS control daemons this process can see: processes running the control program as a
    daemon (``-d``/``-f``; ``control``'s name counts too), the pid files of the default pipe folder
    and CUDA_MPS_PIPE_DIRECTORY's, and (with ``control``) a daemon answering in one of those
    folders whose process is not visible here."""
    found = []
    for pid in _pids():
        argv = _mps_argv(pid, control)
        if argv and ("-d" in argv[1:] or "-f" in argv[1:]) and pid != os.getpid() and alive(pid):
            found.append(Daemon(pid, _user(pid), _pipe_of(pid)))
    for folder in dict.fromkeys([DEFAULT_PIPE_DIRECTORY, settings().mps_pipe_directory or DEFAULT_PIPE_DIRECTORY]):
        if any(d.pipe_directory == folder for d in found):
            continue
        owner = _read_pid(folder)
        if owner is not None and alive(owner) and _mps_argv(owner, control):
            if all(d.pid != owner for d in found):
                found.append(Daemon(owner, _user(owner), folder))
        elif (control is not None and os.path.exists(os.path.join(folder, "control"))
              and _answered(*_ask(control, _client_env(folder), "get_server_list", QUERY_TIMEOUT_S))):
            found.append(Daemon(None, "unknown", folder))  # its process is not visible here (another namespace)
    return sorted(found, key=lambda d: d.pid or 0)


def _refusal(daemons: list[Daemon], control: str) -> MpsError:
    folder = next((d.pipe_directory for d in daemons if d.pipe_directory), "<its pipe folder>")
    # A launcher killed with SIGKILL cannot stop its daemon: say whose it is.
    left = (" (python -m shimrt.launch --mps's: one still running, or one killed before it could stop it)"
            if _PREFIX in folder else "")
    return MpsError(f"an MPS control daemon already runs on this machine: {'; '.join(map(str, daemons))}{left}; a "
                    f"second one would compete with it for the GPU. Stop it (as its user: echo quit | "
                    f"CUDA_MPS_PIPE_DIRECTORY={folder} {control}), or launch without --mps (ranks then join that "
                    "daemon where their CUDA_MPS_PIPE_DIRECTORY names its pipe folder, /tmp/nvidia-mps by default)")


def client_error(exc: ShimrtError) -> ShimrtError:
    """A rank's failure to open its GPU, told that the rank is a client of python -m
    shimrt.launch --mps's daemon and that MPS is the likely cause: a DriverError, or a
    NoDeviceError naming one of :data:`CLIENT_ERRORS`, comes back as the same type with that
    added; any other error (no driver, no such device: not MPS's doing) as it is."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    named = next((name for name in CLIENT_ERRORS if name in text), None)
    if isinstance(exc, NoDeviceError) and not named:
        return exc
    why = ("likely cause: MPS. This rank is a client of python -m shimrt.launch --mps's daemon, whose server did "
           "not take it (too many clients, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, or a failed server)" if named else
           "under MPS: this rank is a client of python -m shimrt.launch --mps's daemon, which may be why")
    hint = f" ({why}; the launcher prints the MPS logs' last lines. Launch again, or without --mps)"
    if isinstance(exc, DriverError):
        return DriverError(exc.call, exc.name, exc.code, exc.description + hint)
    return NoDeviceError(text + hint) if isinstance(exc, NoDeviceError) else exc


def temp_root() -> str:
    """The folder a daemon's private folders are made in: the temporary folder (TMPDIR), as for any
    temporary file, where its path has at most :data:`TEMP_ROOT_MAX` bytes, else /tmp (where it can
    be written). The daemon's sockets (<root>/shimrt-mps-XXXXXXXX/pipe/control) must fit AF_UNIX's
    108 bytes, or it starts and never answers; NVIDIA recommends a local folder such as /tmp."""
    root = tempfile.gettempdir()
    if len(os.fsencode(root)) <= TEMP_ROOT_MAX or not os.access("/tmp", os.W_OK | os.X_OK):
        return root
    return "/tmp"


class Mps:
    """An MPS control daemon of this process's own, with private pipe and log folders.

    ``with Mps() as daemon:`` starts it (:meth:`start`) and stops it (:meth:`stop`) whatever
    happens; give its clients :attr:`environment`. ``control``: the control program (default:
    :func:`find_control`). ``start_timeout``: seconds for it to start and answer;
    ``stop_timeout``: seconds for it to exit after ``quit`` before it is killed.
    """

    def __init__(self, control: str | None = None, *, start_timeout: float = START_TIMEOUT_S,
                 stop_timeout: float = STOP_TIMEOUT_S):
        self.control = None if control is None else validate.text(control, "control")
        self.start_timeout = validate.number(start_timeout, "start_timeout", positive=True)
        self.stop_timeout = validate.number(stop_timeout, "stop_timeout", positive=True)
        self.pid: int | None = None
        self.pipe_directory: str | None = None
        self.log_directory: str | None = None
        self._root: str | None = None

    @property
    def running(self) -> bool:
        """Started and not yet stopped."""
        return self._root is not None

    @property
    def environment(self) -> dict[str, str]:
        """What a client process needs in its environment: the daemon's pipe and log folders, and
        SHIMRT_MPS=1 (a rank whose GPU does not open then names MPS as the likely cause)."""
        _, pipe, log = self._started()
        return {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log, "SHIMRT_MPS": "1"}

    def __enter__(self) -> "Mps":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Mps":
        """Start the daemon and wait until it answers. MpsError, with the reason, when the control
        program is missing, another daemon runs, or it does not start or answer in time; nothing
        is left behind then."""
        if self.running:
            raise UsageError("this MPS daemon has started already")
        self.pid = None
        if self.control is None:
            self.control = find_control()
        elif not _executable(self.control):
            raise MpsError(f"the MPS control program {self.control!r} is not an executable file")
        daemons = running(self.control)
        if daemons:
            raise _refusal(daemons, self.control)
        self._root = tempfile.mkdtemp(prefix=_PREFIX, dir=temp_root())
        self.pipe_directory, self.log_directory = (os.path.join(self._root, d) for d in ("pipe", "log"))
        try:
            os.mkdir(self.pipe_directory, 0o700)
            os.mkdir(self.log_directory, 0o700)
            self._launch()
            self._wait_until_it_answers()
        except BaseException:
            self.stop()
            raise
        return self

    def _started(self) -> tuple[str, str, str]:
        """(the control program, the pipe folder, the log folder) that start() set up; UsageError
        unless it is running (started, not yet stopped)."""
        if not self.running or self.control is None or self.pipe_directory is None or self.log_directory is None:
            raise UsageError("the MPS daemon is not running: start() it first")
        return self.control, self.pipe_directory, self.log_directory

    def _env(self) -> dict[str, str]:
        _, pipe, log = self._started()
        return _client_env(pipe, log)

    def _launch(self) -> None:
        # Output to a file, not a pipe: a daemon holding the pipe open would keep the wait from
        # ever seeing its end. A session of its own: a terminal's Ctrl-C must not reach the daemon,
        # which is stopped after the ranks it serves.
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen([self._started()[0], "-d"], env=self._env(), stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise MpsError(f"the MPS control daemon did not start: {self.control} -d: "
                               f"{exc.strerror or exc}") from None
            try:
                code = proc.wait(self.start_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise MpsError(f"the MPS control daemon did not start: {self.control} -d did not return within "
                               f"{self.start_timeout:g} s{self._log_text()}") from None
            if code != 0:
                out.seek(0)
                said = " ".join(out.read().decode(errors="replace").split())[:300] or "(nothing printed)"
                raise MpsError(f"the MPS control daemon did not start: {self.control} -d exited with code {code}: "
                               f"{said}{self._log_text()}")

    def _wait_until_it_answers(self) -> None:
        control, pipe, _ = self._started()
        deadline = time.monotonic() + self.start_timeout
        while True:
            self.pid = self.pid or _read_pid(pipe)
            left = deadline - time.monotonic()
            code, said = _ask(control, self._env(), "get_server_list", max(min(QUERY_TIMEOUT_S, left), 0.1))
            if _answered(code, said):
                break
            if self.pid is not None and not alive(self.pid):
                raise MpsError(f"the MPS control daemon (pid {self.pid}) exited right after it started"
                               f"{self._log_text()}")
            if time.monotonic() > deadline:
                raise MpsError(f"the MPS control daemon started but did not answer get_server_list within "
                               f"{self.start_timeout:g} s ({said or 'nothing printed'}){self._log_text()}")
            time.sleep(0.1)
        self.pid = self.pid or _read_pid(pipe) or next(iter(self._processes()), None)
        if self.pid is None or not alive(self.pid):
            # A program that exits 0 to anything (/bin/true) "starts" and "answers" without a daemon:
            # the ranks would run outside MPS with no word.
            raise MpsError(f"the MPS control daemon did not start: {self.control} -d returned and answered, but no "
                           f"daemon runs (no {PID_FILE} in its pipe folder, no process of it): is it NVIDIA's "
                           f"{CONTROL}?{self._log_text()}")

    def ask(self, command: str, timeout: float = QUERY_TIMEOUT_S) -> str:
        """What the daemon answers to one control command (``get_server_list``, ...); MpsError when
        it does not answer within ``timeout`` seconds or the control program fails."""
        command = validate.text(command, "command")
        code, said = _ask(self._started()[0], self._env(), command, validate.number(timeout, "timeout", positive=True))
        if code != 0 or _NOT_RUNNING in said.lower():
            raise MpsError(f"the MPS control daemon did not answer {command!r}: {said or f'exit code {code}'}")
        return said

    def _processes(self) -> list[int]:
        """This daemon and its servers: MPS programs of this user running with this pipe folder."""
        mine = [pid for pid in _pids() if _mps_argv(pid, self.control) and _pipe_of(pid) == self.pipe_directory
                and alive(pid)]
        if self.pid is not None and self.pid not in mine and alive(self.pid) and _pipe_of(self.pid) in (
                self.pipe_directory, None):
            mine.insert(0, self.pid)
        return mine

    def log_tail(self, lines: int = 3) -> list[str]:
        """The last ``lines`` lines of the daemon's control.log and server.log, each prefixed with
        its file's name (none before it has written them)."""
        lines = validate.integer(lines, "lines", least=1)
        tail: list[str] = []
        for name in ("control.log", "server.log"):
            try:
                text = Path(self.log_directory or "", name).read_text(errors="replace").splitlines()
            except OSError:
                continue
            tail.extend(f"MPS {name}: {line.strip()}" for line in text[-lines:] if line.strip())
        return tail

    def _log_text(self) -> str:
        tail = self.log_tail(2) if self.log_directory else []
        return ("; its log: " + " | ".join(tail)) if tail else ""

    def stop(self) -> list[str]:
        """Stop the daemon (``quit``; SIGKILL to it and its servers if they are still there after
        ``stop_timeout`` seconds) and remove its folders. Does nothing when it is not running.
        Returns what had to be forced, for the caller to report (empty when ``quit`` did it)."""
        root = self._root
        if root is None:
            return []
        notes = []
        try:
            left = self._processes()  # before quit: the servers it may leave behind are known
            _, said = _ask(self._started()[0], self._env(), "quit", QUERY_TIMEOUT_S)
            # Still this daemon's (its pipe folder), not a newer process that took a freed pid.
            stuck = [p for p in _wait_gone(left, self.stop_timeout) if _pipe_of(p) in (self.pipe_directory, None)]
            for pid in stuck:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if stuck:
                notes.append(f"the MPS daemon did not quit within {self.stop_timeout:g} s ({said or 'quit sent'}); "
                             f"killed its process(es) {', '.join(map(str, stuck))}")
                _wait_gone(stuck, 2)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            self._root = None
        return notes
