"""Sweep of bad inputs: every case runs in its own subprocess, with a timeout, and is classified.

    python scripts/sweep_bad_inputs.py [--jobs N] [--timeout S] [--only WORD] [--root DIR] [--list]

Every case is a value shimrt must refuse (issue 24): a call of the public API (run by a small
harness), a command line (``python -m shimrt...``), or an environment variable under a command.
Each ends in one of:

- ``clean``: a shimrt error (the API) or exit code 2 with one line on stderr (a command; argparse's
  usage lines do not count), naming what the case says the refusal must name, and no traceback;
- ``traceback``: a Python traceback (an exception that is not shimrt's, or one a command let out);
- ``crash``: the process died of a signal (SIGSEGV, SIGBUS, ...);
- ``hang``: it ran past the timeout (its whole process group is then killed);
- ``taken``: the value was taken: the call returned, or the command exited 0 or went on to fail
  for another reason (no GPU here) without naming the value;
- ``unclear``: refused, but with several lines or a message that does not name the value.

It prints the counts and every case that is not clean, and exits 1 if there is one. Without a GPU
(as here) commands that take a value run until they need the device; a value they take then ends
in "no GPU available", which the needle tells apart from a refusal. Cases that only a GPU can
reach are not here: Kernel.launch/prepare arguments on a device, Buffer copies and views, streams
and events, collectives on real buffers (Communicator, groups, prepared calls), NcclBuckets and
Trainer.step, the Engine, workloads and the Interposer, and every bench run past the device's
opening (its values are refused before that, which is what is swept).

``--root DIR`` runs the cases against another checkout (an unmodified copy, to count "before").
This file is a table of cases and is longer than the house's ~400 lines for that reason only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ("clean", "traceback", "crash", "hang", "taken", "unclear")

# The API harness: runs one case's code; a shimrt error is a refusal (exit 3, its message on
# stdout), a return is "taken" (exit 0), anything else a traceback (exit 4).
HARNESS = r"""
import sys, traceback
from shimrt.errors import ShimrtError
try:
    exec(compile(sys.argv[1], "<case>", "exec"), {"__name__": "__case__"})
except ShimrtError as exc:
    print("REFUSED " + type(exc).__name__ + ": " + str(exc).replace("\n", " | "))
    sys.exit(3)
except BaseException:
    traceback.print_exc()
    sys.exit(4)
"""


@dataclass
class Case:
    """One bad input. ``code``: Python run by the harness; or ``argv``: a command after ``python``.
    ``needle``: text (any one of them, any case) the refusal must hold. ``env``: variables added;
    ``setup(tmp)``: makes the case's files in its own folder, returning what replaces each
    ``{name}`` in code, argv and env (``{tmp}``, the folder, is always there). ``reports``
    ("stdout" or "stderr"): a command that goes on by design and says why there (exit code 0 or 1,
    the needle in that stream) instead of refusing."""

    name: str
    needle: str | tuple[str, ...]
    code: str | None = None
    argv: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], dict] | None = None
    timeout: float | None = None
    reports: str | None = None


def api(name, needle, code, **kw) -> Case:
    return Case(name, needle, code=textwrap.dedent(code), **kw)


def cmd(name, needle, *argv, **kw) -> Case:
    return Case(name, needle, argv=list(argv), **kw)


# --- files some cases need ------------------------------------------------------------------------

def _nccl_path() -> str:
    out = subprocess.run([sys.executable, "-c", "from shimrt.nccl import library; print(library.candidates()[0])"],
                         capture_output=True, text=True, env={**_base_env(), "SHIMRT_NCCL_LIBRARY": ""})
    return out.stdout.strip()


def truncated(nbytes: int | None = None, *, minus: int = 0, fraction: float | None = None):
    """A copy of the real libnccl.so.2 cut to ``nbytes`` (or its size - ``minus``, or a fraction)."""
    def make(tmp: Path) -> dict:
        src = Path(NCCL)
        size = src.stat().st_size
        n = nbytes if nbytes is not None else int(size * fraction) if fraction is not None else size - minus
        dst = tmp / "libnccl.so.2"
        with open(src, "rb") as f, open(dst, "wb") as g:
            left = n
            while left:
                chunk = f.read(min(left, 8 << 20))
                if not chunk:
                    break
                g.write(chunk)
                left -= len(chunk)
        return {"lib": str(dst)}
    return make


def patched(offset: int, data: bytes):
    """The first 64 KiB of the real libnccl.so.2 with ``data`` written at ``offset`` (a foreign ELF)."""
    def make(tmp: Path) -> dict:
        head = bytearray(Path(NCCL).open("rb").read(64 << 10))
        head[offset:offset + len(data)] = data
        dst = tmp / "libforeign.so"
        dst.write_bytes(bytes(head))
        return {"lib": str(dst)}
    return make


def text_file(tmp: Path) -> dict:
    (tmp / "libtext.so").write_text("this is not a library\n")
    return {"lib": str(tmp / "libtext.so")}


def fifo(tmp: Path) -> dict:
    os.mkfifo(tmp / "fifo")
    return {"fifo": str(tmp / "fifo")}


def a_file(tmp: Path) -> dict:
    (tmp / "a_file").write_text("x")
    return {"file": str(tmp / "a_file")}


def results(change: Callable[[dict], None] | None = None, raw: str | bytes | None = None):
    """A bench plot results file: a good one changed by ``change``, or ``raw`` text."""
    def make(tmp: Path) -> dict:
        data = _good_results()
        if change is not None:
            change(data)
        text = raw if raw is not None else json.dumps(data)
        (tmp / "results.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        return {"results": str(tmp / "results.json")}
    return make


def _good_results() -> dict:
    runs = []
    for policy in ("sequential", "priority"):
        runs.append({"workload": "w", "policy": policy,
                     "metrics": {"makespan_ms": 2.0, "t_comp_ms": 1.0, "t_comm_ms": 1.0},
                     "timeline": {"compute": [[0.0, 1.0, 0], [0.0, 1.0, 1]], "comm": [[1.0, 2.0, 2]]}})
    return {"schema": "shimrt.bench.overlap/1", "runs": runs, "device": {"name": "GPU", "num_sms": 4}}


def _set(path: str, value):
    """A change that sets results[...] along ``path`` ("runs.0.metrics.makespan_ms") to ``value``."""
    def change(data):
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        obj = data
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value
    return change


def _raw(path: str, literal: str):
    """Results text with a JSON literal json.dumps cannot write (Infinity, NaN, 1e999) at ``path``."""
    data = _good_results()
    _set(path, "@@")(data)
    return json.dumps(data).replace('"@@"', literal)


UID = "ab" * 128
LAUNCHED = {"SHIMRT_RANK": "0", "SHIMRT_WORLD_SIZE": "1", "SHIMRT_LOCAL_RANK": "0", "SHIMRT_NCCL_UNIQUE_ID": UID}
RENDEZVOUS = "from shimrt import launch; launch.rendezvous()"
MODEL = "import torch; from shimrt.torch.step import GradientBuckets; m = torch.nn.Linear(4, 3)\n"


# --- the cases --------------------------------------------------------------------------------------

def cases() -> list[Case]:
    c: list[Case] = []
    # validate: the checks everything else uses
    c += [
        api("validate.number 10**400", "x must", "from shimrt import validate; validate.number(10**400, 'x')"),
        api("validate.number -10**400", "x must", "from shimrt import validate; validate.number(-10**400, 'x')"),
        api("validate.number 10**5000 (beyond int->str)", "x must",
            "from shimrt import validate; validate.number(10**5000, 'x')"),
        api("validate.integer 10**5000 with most", "x must",
            "from shimrt import validate; validate.integer(10**5000, 'x', most=5)"),
        api("validate.integer -10**5000 with least", "x must",
            "from shimrt import validate; validate.integer(-10**5000, 'x', least=0)"),
        api("validate.text lone surrogate", "x must", "from shimrt import validate; validate.text('a\\ud800b', 'x')"),
        api("validate.text bytes", "x must", "from shimrt import validate; validate.text(b'abc', 'x')"),
        api("validate.nbytes 5000 digits", "x must", "from shimrt import validate; validate.nbytes('1' * 5000, 'x')"),
        api("validate.nbytes non-ASCII digits", "x must",
            "from shimrt import validate; validate.nbytes('\\u0661\\u0662', 'x')"),
        api("validate.nbytes 10**30 K", "x must",
            "from shimrt import validate; validate.nbytes('1' + '0' * 30 + 'K', 'x', most=2**40)"),
        api("validate.one_of numpy array", "x must",
            "import numpy as np; from shimrt import validate; validate.one_of(np.array([1, 2]), 'x', (1, 2))"),
        api("validate.one_of unhashable list", "x must",
            "from shimrt import validate; validate.one_of(['a'], 'x', {'a': 1})"),
        api("validate.writable_file lone surrogate", ("x must", "x:"),
            "from shimrt import validate; validate.writable_file('out\\ud800.json', 'x')"),
        api("validate.readable_file lone surrogate", ("x must", "x:"),
            "from shimrt import validate; validate.readable_file('in\\ud800.json', 'x')"),
        api("validate.readable_file a FIFO", "x:",
            "import os; from shimrt import validate; validate.readable_file('{fifo}', 'x')", setup=fifo),
        api("validate.boolean 'no'", "x must", "from shimrt import validate; validate.boolean('no', 'x')"),
    ]
    # compile, targets, occupancy
    c += [
        api("compile: lone surrogate in source", "source must",
            "import shimrt; shimrt.compile('extern \"C\" __global__ void k() {} // \\ud800', 'sm_90')"),
        api("compile: lone surrogate in name", "name must",
            "import shimrt; shimrt.compile('extern \"C\" __global__ void k() {}', 'sm_90', name='k\\ud800.cu')"),
        api("compile: lone surrogate in an option", "option",
            "import shimrt; shimrt.compile('extern \"C\" __global__ void k() {}', 'sm_90', options=['-DX=\\ud800'])"),
        api("compile: options a generator", "options must",
            "import shimrt; shimrt.compile('extern \"C\" __global__ void k() {}', 'sm_90', options=(o for o in []))"),
        api("compile: target a number", "target", "import shimrt; shimrt.compile('x', 90)"),
        api("compile: target with lone surrogate", "target", "import shimrt; shimrt.compile('x', 'sm_\\ud800')"),
        api("compile: target sm_ huge", "target", "import shimrt; shimrt.compile('x', 'sm_' + '9' * 5000)"),
        api("compile: include dir with lone surrogate", "include dir",
            "import shimrt; shimrt.compile('x', 'sm_90', include_dirs=['/tmp/\\ud800'])"),
        api("kernels.source path out of kernels_src", "kernel source",
            "from shimrt import kernels; kernels.source('../../../etc/passwd')"),
        # kernels.py is the compile cache engineer's (issue 24's brief): reported, not fixed here.
        api("kernels.source name of 5000 characters", "kernel source",
            "from shimrt import kernels; kernels.source('a' * 5000)"),
        api("targets.get empty", "target", "from shimrt import targets; targets.get('')"),
        api("targets.get None", "target", "from shimrt import targets; targets.get(None)"),
        api("targets.get list", "target", "from shimrt import targets; targets.get(['H200'])"),
        api("Target.with_ num_sms 0", "num_sms", "from shimrt import targets; targets.get('H200').with_(num_sms=0)"),
        api("Target.with_ num_sms 10**400", "num_sms",
            "from shimrt import targets; targets.get('H200').with_(num_sms=10**400)"),
        api("Target.with_ unknown field", "bogus", "from shimrt import targets; targets.get('H200').with_(bogus=1)"),
        api("occupancy block_size 1.0", "block_size",
            "from shimrt import occupancy; occupancy.occupancy('H200', block_size=1.0, registers=32)"),
        api("occupancy registers -1", "registers",
            "from shimrt import occupancy; occupancy.occupancy('H200', block_size=256, registers=-1)"),
        api("occupancy target lone surrogate", "target",
            "from shimrt import occupancy; occupancy.occupancy('H2\\ud80000', block_size=256, registers=32)"),
        api("max_active_blocks dynamic_smem float", "dynamic_smem",
            "from shimrt import occupancy; "
            "occupancy.max_active_blocks('H200', block_size=256, registers=32, dynamic_smem=1.5)"),
        api("shape resources registers 1e308", "registers",
            "from shimrt import occupancy; "
            "occupancy.shape('H200', {'registers': 1e308, 'static_smem': 0}, 256, resident_blocks=1)"),
        api("shape resources not a dict", "resources",
            "from shimrt import occupancy; occupancy.shape('H200', 5, 256, resident_blocks=1)"),
        api("Footprint name lone surrogate", "name",
            "from shimrt.occupancy import Footprint; Footprint('f\\ud800', 1, 256, 32, 0, 0)"),
        api("Footprint threads 0", "threads", "from shimrt.occupancy import Footprint; Footprint('f', 1, 0, 32, 0, 0)"),
        api("Footprint.with_threads 1.5", "threads",
            "from shimrt.occupancy import NCCL_2_28_SM90; NCCL_2_28_SM90.with_threads(1.5)"),
        api("coresident reserve not a Footprint", "reserve",
            "from shimrt import occupancy; "
            "occupancy.coresident('H200', {'registers': 32, 'static_smem': 0}, 256, 'nccl')"),
    ]
    # CommOptions and the NCCL binding's pure checks
    c += [
        api("CommOptions timeout 10**400", "timeout",
            "from shimrt.nccl import CommOptions; CommOptions(timeout=10**400)"),
        api("CommOptions timeout -0.0", "timeout", "from shimrt.nccl import CommOptions; CommOptions(timeout=-0.0)"),
        api("CommOptions min_ctas 10**400", "min_ctas",
            "from shimrt.nccl import CommOptions; CommOptions(min_ctas=10**400)"),
        api("CommOptions net_name lone surrogate", "net_name",
            "from shimrt.nccl import CommOptions; CommOptions(net_name='I\\ud800B')"),
        api("CommOptions cta_policy numpy array", "cta_policy",
            "import numpy as np; from shimrt.nccl import CommOptions; "
            "CommOptions(cta_policy=np.array(['default', 'zero']))"),
        api("CommOptions cta_policy list", "cta_policy",
            "from shimrt.nccl import CommOptions; CommOptions(cta_policy=['zero'])"),
        api("CommOptions blocking 'yes'", "blocking",
            "from shimrt.nccl import CommOptions; CommOptions(blocking='yes')"),
        api("buffer_counts count 10**400", "count",
            "from shimrt.nccl import buffer_counts; buffer_counts('all_reduce', 10**400, 2)"),
        api("buffer_counts size 2**31", "size",
            "from shimrt.nccl import buffer_counts; buffer_counts('all_gather', 8, 2**31)"),
        api("buffer_counts collective list", "collective",
            "from shimrt.nccl import buffer_counts; buffer_counts(['all_reduce'], 8, 2)"),
        api("buffer_counts given 'both'", "given",
            "from shimrt.nccl import buffer_counts; buffer_counts('all_reduce', 8, 2, given='both')"),
        api("op_of op a list", "op",
            "from shimrt.nccl import collectives as c; c.op_of('all_reduce', c.COLLECTIVES['all_reduce'], ['sum'])"),
        api("op_of op a dict", "op",
            "from shimrt.nccl import collectives as c; c.op_of('all_reduce', c.COLLECTIVES['all_reduce'], {})"),
        api("rank_of root 10**400", "root",
            "from shimrt.nccl import collectives as c; "
            "c.rank_of('broadcast', c.COLLECTIVES['broadcast'], 2, 10**400, None)"),
        api("rank_of peer float", "peer",
            "from shimrt.nccl import collectives as c; c.rank_of('send', c.COLLECTIVES['send'], 2, None, 1.0)"),
        api("Communicator size 2**31", "size",
            "from shimrt.nccl import Communicator; Communicator(None, bytes(128), 0, 2**31)"),
        api("Communicator unique id short", "unique",
            "from shimrt.nccl import Communicator; Communicator(None, bytes(12), 0, 1)"),
        api("Communicator rank = size", "rank",
            "from shimrt.nccl import Communicator; Communicator(None, bytes(128), 2, 2)"),
        api("unique_id backend 'cuda11'", "backend", "from shimrt.nccl import unique_id; unique_id(backend='cuda11')"),
        api("library.candidates backend None", "backend", "from shimrt.nccl import library; library.candidates(None)"),
        api("ncclConfig version 10**400", "version", "from shimrt.nccl import config; config.structure(10**400)"),
        api("CommOptions.build version string", "version",
            "from shimrt.nccl import CommOptions; CommOptions().build('2.28')"),
    ]
    # the NCCL library named by SHIMRT_NCCL_LIBRARY: truncated, foreign, not a file
    load = "from shimrt.nccl import library; library.load()"
    lib = {"SHIMRT_NCCL_LIBRARY": "{lib}"}
    c += [
        api("libnccl truncated to 64 B", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=truncated(64)),
        api("libnccl truncated to 4 KiB", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=truncated(4096)),
        api("libnccl truncated to 1 MiB", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=truncated(1 << 20)),
        api("libnccl truncated to half", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=truncated(fraction=0.5)),
        api("libnccl truncated by 1 MiB", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=truncated(minus=1 << 20)),
        api("libnccl short of its last byte", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=truncated(minus=1)),
        api("libnccl empty", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=truncated(0)),
        api("libnccl a text file", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=text_file),
        api("libnccl /bin/true", "SHIMRT_NCCL_LIBRARY", load, env={"SHIMRT_NCCL_LIBRARY": "/bin/true"}),
        api("libnccl libc (no ncclGetVersion)", "SHIMRT_NCCL_LIBRARY", load,
            env={"SHIMRT_NCCL_LIBRARY": "/lib/x86_64-linux-gnu/libc.so.6"}),
        api("libnccl a 32-bit ELF", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=patched(4, b"\x01")),
        api("libnccl big-endian ELF", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=patched(5, b"\x02")),
        api("libnccl for aarch64", "SHIMRT_NCCL_LIBRARY", load, env=lib, setup=patched(18, b"\xb7\x00")),
        api("libnccl a folder", "SHIMRT_NCCL_LIBRARY", load, env={"SHIMRT_NCCL_LIBRARY": "{tmp}"}),
        api("libnccl a FIFO", "SHIMRT_NCCL_LIBRARY", load, env={"SHIMRT_NCCL_LIBRARY": "{fifo}"}, setup=fifo),
        api("libnccl /dev/zero", "SHIMRT_NCCL_LIBRARY", load, env={"SHIMRT_NCCL_LIBRARY": "/dev/zero"}),
        api("libnccl missing", "SHIMRT_NCCL_LIBRARY", load, env={"SHIMRT_NCCL_LIBRARY": "{tmp}/nope.so"}),
        # The selftest reports NCCL as a skipped check, with the reason; the launcher starts the
        # ranks all the same, saying why a rank's launch.init() will fail (by design: README).
        cmd("selftest with a truncated libnccl", "truncated", "-m", "shimrt.selftest", "--quiet", env=lib,
            setup=truncated(1 << 20), timeout=60, reports="stdout"),
        cmd("launcher with a truncated libnccl", "truncated", "-m", "shimrt.launch", "--nproc", "1", "-m",
            "shimrt", env=lib, setup=truncated(1 << 20), reports="stderr"),
    ]
    # torch extra, pure parts (torch on the CPU)
    c += [
        api("GradientBuckets: no trainable parameters", "parameter",
            MODEL + "m.requires_grad_(False); GradientBuckets(m, 1 << 20)"),
        api("GradientBuckets: not a model", "model", MODEL + "GradientBuckets('model', 1 << 20)"),
        api("GradientBuckets: bucket_bytes 0", "bucket_bytes", MODEL + "GradientBuckets(m, 0)"),
        api("GradientBuckets: stale after zero_grad(set_to_none=True)", "zero_grad",
            MODEL + textwrap.dedent("""
            b = GradientBuckets(m, 1 << 20)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            m(torch.ones(2, 4)).sum().backward()
            b.check_views()
            opt.zero_grad()  # torch's default: set_to_none=True
            m(torch.ones(2, 4)).sum().backward()
            b.check_views()
            """)),
        api("GradientBuckets: .grad replaced by a copy", "grad",
            MODEL + "b = GradientBuckets(m, 1 << 20); m.weight.grad = m.weight.grad.clone(); b.check_views()"),
        api("Policy carveout 10**12", "carveout", "from shimrt.torch.policies import Carveout; Carveout(10**12)"),
        api("Policy partition 10**12", "partition",
            "from shimrt.torch.policies import Partition; Partition(10**12)"),
        api("Policy name lone surrogate", "name", "from shimrt.torch.policies import Policy; Policy('p\\ud800')"),
        api("Policy name empty", "name", "from shimrt.torch.policies import Policy; Policy('')"),
        api("Trainer lr nan", "lr", MODEL + textwrap.dedent("""
            from shimrt.bench.torch_trainer import Trainer
            Trainer(m, (torch.ones(2, 4),), GradientBuckets(m, 1 << 20), lr=float('nan'))""")),
        api("Trainer lr -1", "lr", MODEL + textwrap.dedent("""
            from shimrt.bench.torch_trainer import Trainer
            Trainer(m, (torch.ones(2, 4),), GradientBuckets(m, 1 << 20), lr=-1.0)""")),
        api("Trainer buckets not GradientBuckets", "buckets", MODEL + textwrap.dedent("""
            from shimrt.bench.torch_trainer import Trainer
            Trainer(m, (torch.ones(2, 4),), None)""")),
        api("sm_carveout 10**12", "sms", "import shimrt.torch as st\nwith st.sm_carveout(10**12): pass"),
        api("sm_carveout -1", "sms", "import shimrt.torch as st\nwith st.sm_carveout(-1): pass"),
        api("shimrt.torch.stream(None)", "stream", "import shimrt.torch as st; st.stream(None)"),
        api("process_group_options 'yes'", "high_priority",
            "import shimrt.torch as st; st.process_group_options('yes')"),
        api("ModelSize width 10**30", "width",
            "from shimrt.bench.torch_model import ModelSize; ModelSize(width=10**30, heads=16)"),
        api("ModelSize weights 'fp8'", "weights",
            "from shimrt.bench.torch_model import ModelSize; ModelSize(weights='fp8')"),
        api("compute_context not a Policy", "policy",
            "from shimrt.torch.resources import compute_context\nwith compute_context('sequential'): pass"),
    ]
    # the overlap planner and specs
    problem = ("from shimrt import targets; from shimrt.occupancy import NCCL_2_28_SM90\n"
               "from shimrt.overlap import planner\n"
               "p = planner.Problem(targets.get('H200'), {'registers': 32, 'static_smem': 0}, 256,\n"
               "                    NCCL_2_28_SM90, 16)\n")
    c += [
        api("Choice comm_threads 10**9", "comm_threads",
            "from shimrt.overlap.planner import Choice; Choice('priority', comm_threads=10**9)"),
        api("Choice partition_sms 10**12", "partition_sms",
            "from shimrt.overlap.planner import Choice; Choice('partition', partition_sms=10**12)"),
        api("Choice resident_blocks 10**12", "resident_blocks",
            "from shimrt.overlap.planner import Choice; Choice('shaping', resident_blocks=10**12, dynamic_smem=0)"),
        api("Choice dynamic_smem 10**30", "dynamic_smem",
            "from shimrt.overlap.planner import Choice; Choice('shaping', resident_blocks=1, dynamic_smem=10**30)"),
        api("Choice.from_dict auto", "policy",
            "from shimrt.overlap.planner import Choice; Choice.from_dict({'policy': 'auto'})"),
        api("Choice.from_dict non-string key", "Choice",
            "from shimrt.overlap.planner import Choice; Choice.from_dict({1: 2})"),
        api("Choice.from_dict list policy", "policy",
            "from shimrt.overlap.planner import Choice; Choice.from_dict({'policy': ['x']})"),
        api("plan policy list", "policy", problem + "planner.plan(['shaping'], p)"),
        api("estimate t_comp 10**400", "t_comp", problem + "planner.estimate(p, 10**400, 1.0)"),
        api("estimate t_comp 1e308 (inf makespan)", "t_comp", problem + "planner.estimate(p, 1e308, 1e308)"),
        api("estimate t_comm nan", "t_comm", problem + "planner.estimate(p, 1.0, float('nan'))"),
        api("Problem comm_blocks 2**31", "comm_blocks",
            problem.replace(", 16)", ", 2**31)")),
        api("Problem compute registers 'many'", "registers",
            problem.replace("'registers': 32", "'registers': 'many'")),
        api("candidates threads 10**400", "threads", problem + "planner.candidates(p, threads=[10**400])"),
        api("candidates partition_steps 0", "partition_steps", problem + "planner.candidates(p, partition_steps=0)"),
        api("candidates blocks a set", "blocks", problem + "planner.candidates(p, blocks={8})"),
        api("StandInSpec nbytes 10**400", "nbytes",
            "from shimrt.overlap.standin import StandInSpec; StandInSpec(10**400)"),
        api("StandInSpec link_gbps 1e308", "link_gbps",
            "from shimrt.overlap.standin import StandInSpec; StandInSpec(1 << 20, link_gbps=1e308)"),
        api("StandInSpec dynamic_smem 10**30", "dynamic_smem",
            "from shimrt.overlap.standin import StandInSpec; StandInSpec(1 << 20, dynamic_smem=10**30)"),
        api("StandInSpec collective bogus", "collective",
            "from shimrt.overlap.standin import StandInSpec; StandInSpec(1 << 20, collective='bogus')"),
        api("ComputeSpec size 10**400", "size",
            "from shimrt.overlap.workloads import ComputeSpec; ComputeSpec('softmax', 10**400)"),
        api("ComputeSpec kind lone surrogate", "kind",
            "from shimrt.overlap.workloads import ComputeSpec; ComputeSpec('soft\\ud800max', 8)"),
        api("ComputeSpec block 10**9", "block",
            "from shimrt.overlap.workloads import ComputeSpec; ComputeSpec('softmax', 8, 10**9)"),
        api("metrics.compute t_comp nan", "t_comp",
            "from shimrt.overlap import metrics; metrics.compute(float('nan'), 1, 2, 2, 1, 0)"),
        api("metrics.compute makespan 10**400", "makespan",
            "from shimrt.overlap import metrics; metrics.compute(1, 1, 2, 10**400, 1, 0)"),
        api("metrics.compute comm_start_delay 1e309", "comm_start_delay",
            "from shimrt.overlap import metrics; metrics.compute(1, 1, 2, 2, 1, float('inf'))"),
    ]
    # environment variables read by settings() and launch_env(), through the API
    settings = "from shimrt import config; config.settings()"
    launch_env = "from shimrt import config; config.launch_env()"
    c += [
        api("settings: SHIMRT_CACHE_DIR ~nosuchuser", "SHIMRT_CACHE_DIR", settings,
            env={"SHIMRT_CACHE_DIR": "~nosuchuser/x"}),
        api("settings: SHIMRT_CACHE_DIR relative", "SHIMRT_CACHE_DIR", settings, env={"SHIMRT_CACHE_DIR": "rel/cache"}),
        api("settings: SHIMRT_CACHE_DIR ./", "SHIMRT_CACHE_DIR", settings, env={"SHIMRT_CACHE_DIR": "."}),
        api("settings: SHIMRT_CACHE_DIR /dev/null", "SHIMRT_CACHE_DIR",
            settings, env={"SHIMRT_CACHE_DIR": "/dev/null"}),
        api("settings: SHIMRT_CACHE_DIR a file", "SHIMRT_CACHE_DIR", settings,
            env={"SHIMRT_CACHE_DIR": "{file}"}, setup=a_file),
        api("settings: HOME empty, no SHIMRT_CACHE_DIR", ("HOME", "SHIMRT_CACHE_DIR"), settings,
            env={"SHIMRT_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": ""}),
        api("settings: HOME relative, no SHIMRT_CACHE_DIR", ("HOME", "SHIMRT_CACHE_DIR"), settings,
            env={"SHIMRT_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": "home"}),
        api("settings: SHIMRT_BACKEND cuda,hip", "SHIMRT_BACKEND", settings, env={"SHIMRT_BACKEND": "cuda,hip"}),
        api("settings: SHIMRT_BACKEND nvidia", "SHIMRT_BACKEND", settings, env={"SHIMRT_BACKEND": "nvidia"}),
        api("settings: SHIMRT_DISABLE_CACHE 2", "SHIMRT_DISABLE_CACHE", settings, env={"SHIMRT_DISABLE_CACHE": "2"}),
        api("settings: SHIMRT_DISABLE_CACHE 'yes please'", "SHIMRT_DISABLE_CACHE", settings,
            env={"SHIMRT_DISABLE_CACHE": "yes please"}),
        api("launch_env: SHIMRT_WORLD_SIZE 3000000000", "SHIMRT_WORLD_SIZE", launch_env,
            env={**LAUNCHED, "SHIMRT_WORLD_SIZE": "3000000000"}),
        api("rendezvous: SHIMRT_WORLD_SIZE 2**31", "SHIMRT_WORLD_SIZE", RENDEZVOUS,
            env={**LAUNCHED, "SHIMRT_WORLD_SIZE": str(2**31), "SHIMRT_LOCAL_WORLD_SIZE": "1"}),
        api("launch_env: SHIMRT_RANK x", "SHIMRT_RANK", launch_env, env={**LAUNCHED, "SHIMRT_RANK": "x"}),
        api("launch_env: SHIMRT_RANK = size", "SHIMRT_RANK", launch_env, env={**LAUNCHED, "SHIMRT_RANK": "1"}),
        api("launch_env: SHIMRT_RANK 1_0", "SHIMRT_RANK", launch_env,
            env={**LAUNCHED, "SHIMRT_RANK": "1_0", "SHIMRT_WORLD_SIZE": "20"}),
        api("launch_env: SHIMRT_RANK Arabic digit", "SHIMRT_RANK",
            launch_env, env={**LAUNCHED, "SHIMRT_RANK": "\u0660"}),
        api("launch_env: SHIMRT_LOCAL_RANK missing", "SHIMRT_LOCAL_RANK", launch_env,
            env={**LAUNCHED, "SHIMRT_LOCAL_RANK": ""}),
        api("launch_env: SHIMRT_LOCAL_WORLD_SIZE > world", "SHIMRT_LOCAL_WORLD_SIZE", launch_env,
            env={**LAUNCHED, "SHIMRT_LOCAL_WORLD_SIZE": "2"}),
        api("launch_env: SHIMRT_LOCAL_RANK 1 of 1", "SHIMRT_LOCAL_RANK", launch_env,
            env={**LAUNCHED, "SHIMRT_LOCAL_RANK": "1"}),
        api("launch_env: unique id short", "SHIMRT_NCCL_UNIQUE_ID", launch_env,
            env={**LAUNCHED, "SHIMRT_NCCL_UNIQUE_ID": "abcd"}),
        api("launch_env: unique id not hex", "SHIMRT_NCCL_UNIQUE_ID", launch_env,
            env={**LAUNCHED, "SHIMRT_NCCL_UNIQUE_ID": "zz" * 128}),
        api("launch_env: SHIMRT_MPS maybe", "SHIMRT_MPS", launch_env, env={**LAUNCHED, "SHIMRT_MPS": "maybe"}),
        api("launch_env: SHIMRT_MPS maybe, not launched", "SHIMRT_MPS", launch_env, env={"SHIMRT_MPS": "maybe"}),
        api("launch_env: SHIMRT_WORLD_SIZE without SHIMRT_RANK", "SHIMRT_RANK", launch_env,
            env={"SHIMRT_WORLD_SIZE": "4"}),
        api("launch_env: SHIMRT_NCCL_UNIQUE_ID without SHIMRT_RANK", "SHIMRT_RANK", launch_env,
            env={"SHIMRT_NCCL_UNIQUE_ID": UID}),
        api("launch_env: SHIMRT_LOCAL_RANK without SHIMRT_RANK", "SHIMRT_RANK", launch_env,
            env={"SHIMRT_LOCAL_RANK": "1"}),
        api("launch_env: torchrun WORLD_SIZE abc", "WORLD_SIZE", launch_env, env={"RANK": "0", "WORLD_SIZE": "abc"}),
        api("launch_env: torchrun WORLD_SIZE 2**31", "WORLD_SIZE", launch_env,
            env={"RANK": "0", "WORLD_SIZE": str(2**31)}),
        api("launch_env: torchrun RANK -1", "RANK", launch_env, env={"RANK": "-1", "WORLD_SIZE": "2"}),
        api("launch_env: torchrun MASTER_PORT 70000", "MASTER_PORT", launch_env,
            env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}),
        api("launch_env: torchrun MASTER_PORT http", "MASTER_PORT", launch_env,
            env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}),
        api("launch_env: MPI size 0", "OMPI_COMM_WORLD_SIZE", launch_env,
            env={"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}),
        api("launch_env: PMI rank 5 of 2", "PMI_RANK", launch_env, env={"PMI_RANK": "5", "PMI_SIZE": "2"}),
        api("launch_env: SHIMRT_DEVICES 0,,1", "SHIMRT_DEVICES", launch_env, env={"SHIMRT_DEVICES": "0,,1"}),
        api("launch_env: SHIMRT_DEVICES -1", "SHIMRT_DEVICES", launch_env, env={"SHIMRT_DEVICES": "-1"}),
        api("launch_env: SHIMRT_DEVICES 0;1", "SHIMRT_DEVICES", launch_env, env={"SHIMRT_DEVICES": "0;1"}),
        api("launch_env: SHIMRT_DEVICES 2**31", "SHIMRT_DEVICES", launch_env, env={"SHIMRT_DEVICES": str(2**31)}),
        api("launch_env: SHIMRT_DEVICES too few", "SHIMRT_DEVICES", launch_env,
            env={**LAUNCHED, "SHIMRT_WORLD_SIZE": "2", "SHIMRT_LOCAL_WORLD_SIZE": "2", "SHIMRT_DEVICES": "0"}),
        api("Device index 2**31", "index", "import shimrt; shimrt.Device(2**31)"),
        api("Device backend 'cuda ' list", "backend", "import shimrt; shimrt.Device(0, backend=['cuda'])"),
    ]
    # environment variables under the commands
    c += [
        cmd("python -m shimrt, SHIMRT_CACHE_DIR ~nosuchuser", "SHIMRT_CACHE_DIR", "-m", "shimrt",
            env={"SHIMRT_CACHE_DIR": "~nosuchuser/x"}),
        cmd("launcher, SHIMRT_CACHE_DIR ~nosuchuser", "SHIMRT_CACHE_DIR", "-m", "shimrt.launch", "--nproc", "1", "-m",
            "shimrt", env={"SHIMRT_CACHE_DIR": "~nosuchuser/x"}),
        cmd("selftest, SHIMRT_CACHE_DIR relative", "SHIMRT_CACHE_DIR", "-m", "shimrt.selftest", "--quiet",
            env={"SHIMRT_CACHE_DIR": "rel/cache"}, timeout=60),
        cmd("selftest, SHIMRT_CACHE_DIR /dev/null", "SHIMRT_CACHE_DIR", "-m", "shimrt.selftest", "--quiet",
            env={"SHIMRT_CACHE_DIR": "/dev/null"}, timeout=60),
        cmd("selftest, SHIMRT_DEVICES abc", "SHIMRT_DEVICES", "-m", "shimrt.selftest", "--quiet",
            env={"SHIMRT_DEVICES": "abc"}, timeout=60),
        cmd("selftest, SHIMRT_DEVICES 0,-1", "SHIMRT_DEVICES", "-m", "shimrt.selftest", "--quiet",
            env={"SHIMRT_DEVICES": "0,-1"}, timeout=60),
        cmd("selftest, SHIMRT_RANK without the rest", "SHIMRT_", "-m", "shimrt.selftest", "--quiet",
            env={"SHIMRT_RANK": "0"}, timeout=60),
        cmd("selftest, SHIMRT_MPS maybe", "SHIMRT_MPS", "-m", "shimrt.selftest", "--quiet",
            env={"SHIMRT_MPS": "maybe"}, timeout=60),
        cmd("bench plot, SHIMRT_BACKEND bogus", "SHIMRT_BACKEND", "-m", "shimrt.bench", "plot", "{results}",
            env={"SHIMRT_BACKEND": "bogus"}, setup=results()),
        cmd("bench gemm, SHIMRT_DISABLE_CACHE perhaps", "SHIMRT_DISABLE_CACHE", "-m", "shimrt.bench", "gemm",
            env={"SHIMRT_DISABLE_CACHE": "perhaps"}),
        cmd("bench overlap, SHIMRT_DEVICES x", "SHIMRT_DEVICES", "-m", "shimrt.bench", "overlap",
            env={"SHIMRT_DEVICES": "x"}),
        cmd("footprint, SHIMRT_CACHE_DIR a file", "SHIMRT_CACHE_DIR", "-m", "shimrt.overlap.footprint",
            env={"SHIMRT_CACHE_DIR": "{file}"}, setup=a_file),
        cmd("launcher, SHIMRT_DEVICES 0,x", "SHIMRT_DEVICES", "-m", "shimrt.launch", "--nproc", "1", "-m", "shimrt",
            env={"SHIMRT_DEVICES": "0,x"}),
        cmd("launcher, SHIMRT_DEVICES 0,0 for one rank", "SHIMRT_DEVICES", "-m", "shimrt.launch", "--nproc", "1", "-m",
            "shimrt", env={"SHIMRT_DEVICES": "0,0"}),
        cmd("launcher, SHIMRT_MPS_CONTROL missing", "SHIMRT_MPS_CONTROL",
            "-m", "shimrt.launch", "--nproc", "1", "--mps",
            "-m", "shimrt", env={"SHIMRT_MPS_CONTROL": "{tmp}/nope"}),
        cmd("launcher, SHIMRT_MPS_CONTROL not executable", "SHIMRT_MPS_CONTROL", "-m", "shimrt.launch", "--nproc", "1",
            "--mps", "-m", "shimrt", env={"SHIMRT_MPS_CONTROL": "{file}"}, setup=a_file),
        cmd("launcher, SHIMRT_MPS_CONTROL /bin/true (no daemon)", "no daemon runs", "-m", "shimrt.launch", "--nproc",
            "1", "--mps", "-m", "shimrt", env={"SHIMRT_MPS_CONTROL": "/bin/true"}),
        cmd("launcher, SHIMRT_MPS_CONTROL /bin/sleep (not MPS)", "did not start", "-m", "shimrt.launch", "--nproc",
            "1", "--mps", "-m", "shimrt", env={"SHIMRT_MPS_CONTROL": "/bin/sleep"}),
        cmd("launcher, SHIMRT_MPS_CONTROL a folder", "SHIMRT_MPS_CONTROL", "-m", "shimrt.launch", "--nproc", "1",
            "--mps", "-m", "shimrt", env={"SHIMRT_MPS_CONTROL": "{tmp}"}),
        cmd("launcher inside a launch of 2**31 ranks", "SHIMRT_WORLD_SIZE", "-m", "shimrt.launch", "--nproc", "1",
            "-m", "shimrt", env={**LAUNCHED, "SHIMRT_WORLD_SIZE": str(2**31)}),
        cmd("python -m shimrt inside a launch of 2**31 ranks", "SHIMRT_WORLD_SIZE", "-m", "shimrt",
            env={**LAUNCHED, "SHIMRT_WORLD_SIZE": str(2**31)}),
    ]
    # command lines: python -m shimrt, the launcher, the selftest, footprint
    c += [
        cmd("shimrt --bogus", "--bogus", "-m", "shimrt", "--bogus"),
        cmd("shimrt extra argument", "extra", "-m", "shimrt", "extra"),
        cmd("launch --nproc 2**31", "--nproc", "-m", "shimrt.launch", "--nproc", str(2**31), "-m", "shimrt",
            "--version"),
        cmd("launch --nproc 0", "--nproc", "-m", "shimrt.launch", "--nproc", "0", "-m", "shimrt"),
        cmd("launch --nproc 1e3", "--nproc", "-m", "shimrt.launch", "--nproc", "1e3", "-m", "shimrt"),
        cmd("launch --nnodes 2", "--nnodes", "-m", "shimrt.launch", "--nproc", "1", "--nnodes", "2", "-m", "shimrt"),
        cmd("launch --nnodes 1.0", "--nnodes",
            "-m", "shimrt.launch", "--nproc", "1", "--nnodes", "1.0", "-m", "shimrt"),
        cmd("launch --nnodes 1:2 (elastic)", "--nnodes", "-m", "shimrt.launch", "--nproc", "1", "--nnodes", "1:2",
            "-m", "shimrt"),
        cmd("launch --timeout 1e400", "--timeout", "-m", "shimrt.launch", "--nproc", "1", "--timeout", "1e400",
            "-m", "shimrt"),
        cmd("launch --timeout 1e308", "--timeout", "-m", "shimrt.launch", "--nproc", "1", "--timeout", "1e308",
            "-m", "shimrt"),
        cmd("launch --timeout nan", "--timeout",
            "-m", "shimrt.launch", "--nproc", "1", "--timeout", "nan", "-m", "shimrt"),
        cmd("launch --devices 0,x", "--devices",
            "-m", "shimrt.launch", "--nproc", "2", "--devices", "0,x", "-m", "shimrt"),
        cmd("launch --devices one for two ranks", "--devices", "-m", "shimrt.launch", "--nproc", "2", "--devices", "0",
            "-m", "shimrt"),
        cmd("launch --devices 2**31", "--devices", "-m", "shimrt.launch", "--nproc", "1", "--devices", str(2**31),
            "-m", "shimrt"),
        cmd("launch --devices empty", "--devices", "-m", "shimrt.launch", "--nproc", "1", "--devices=", "-m", "shimrt"),
        cmd("launch -m with no module", "-m", "-m", "shimrt.launch", "--nproc", "1", "-m"),
        cmd("launch -m empty module name", "module", "-m", "shimrt.launch", "--nproc", "1", "-m", ""),
        cmd("launch -m not a module name", "module", "-m", "shimrt.launch", "--nproc", "1", "-m", "no such/module"),
        cmd("launch script missing", "script", "-m", "shimrt.launch", "--nproc", "1", "{tmp}/nope.py"),
        cmd("launch script a folder", "script", "-m", "shimrt.launch", "--nproc", "1", "{tmp}"),
        cmd("launch script a FIFO", "script", "-m", "shimrt.launch", "--nproc", "1", "{fifo}", setup=fifo),
        cmd("launch no script", "script", "-m", "shimrt.launch", "--nproc", "1"),
        cmd("launch without --nproc", "--nproc", "-m", "shimrt.launch", "-m", "shimrt"),
        cmd("selftest --json=1", "--json", "-m", "shimrt.selftest", "--json=1"),
        cmd("selftest extra argument", "extra", "-m", "shimrt.selftest", "extra"),
        cmd("footprint --bytes 3", "--bytes", "-m", "shimrt.overlap.footprint", "--bytes", "3"),
        cmd("footprint --bytes 1e3", "--bytes", "-m", "shimrt.overlap.footprint", "--bytes", "1e3"),
        cmd("footprint --bytes 5000 digits", "--bytes", "-m", "shimrt.overlap.footprint", "--bytes", "9" * 5000),
        cmd("footprint --bytes Arabic digits", "--bytes",
            "-m", "shimrt.overlap.footprint", "--bytes", "\u0664\u0660\u0669\u0666"),
        cmd("footprint --json under a file", "--json", "-m", "shimrt.overlap.footprint", "--json", "{file}/x.json",
            setup=a_file),
        cmd("footprint --json a folder", "--json", "-m", "shimrt.overlap.footprint", "--json", "{tmp}"),
    ]
    # bench subcommands
    bench = ("-m", "shimrt.bench")
    big = "9" * 30
    c += [
        cmd("bench no command", "COMMAND", *bench),
        cmd("bench bogus command", "bogus", *bench, "bogus"),
        cmd("bench launch --batch 10**30", "--batch", *bench, "launch", "--batch", big),
        cmd("bench launch --launches 10**30", "--launches", *bench, "launch", "--launches", big),
        cmd("bench launch --rounds 10**30", "--rounds", *bench, "launch", "--rounds", big),
        cmd("bench launch --batches 5000 digits", "--batches", *bench, "launch", "--batches", "9" * 5000),
        cmd("bench collectives -n 10**30", "--iters", *bench, "collectives", "-n", big),
        cmd("bench collectives -w 10**30", "--warmup", *bench, "collectives", "-w", big),
        cmd("bench collectives -f 10**30", "--factor", *bench, "collectives", "-f", big),
        cmd("bench collectives -b > -e", ("--min-bytes", "--max-bytes"), *bench, "collectives", "-b", "1G", "-e", "8"),
        cmd("bench collectives --latency-calls 10**30", "--latency-calls",
            *bench, "collectives", "--latency-calls", big),
        cmd("bench collectives --latency-calls 0", "--latency-calls", *bench, "collectives", "--latency-calls", "0"),
        cmd("bench collectives --ops ,", "--ops", *bench, "collectives", "--ops", ","),
        cmd("bench collectives -b Arabic digits", "--min-bytes", *bench, "collectives", "-b", "\u0668"),
        cmd("bench collectives --json /dev/null/x", "--json", *bench, "collectives", "--json", "/dev/null/x"),
        cmd("bench gemm --repeats 10**30", "--repeats", *bench, "gemm", "--repeats", big),
        cmd("bench gemm --warmup 10**30", "--warmup", *bench, "gemm", "--warmup", big),
        cmd("bench gemm --size 128.0", "--size", *bench, "gemm", "--size", "128.0"),
        cmd("bench overlap --repeats 10**30", "--repeats", *bench, "overlap", "--repeats", big),
        cmd("bench overlap --comm-ratios 1e308", "--comm-ratios", *bench, "overlap", "--comm-ratios", "1e308"),
        cmd("bench overlap --comm-ratios 1e-300", "--comm-ratios", *bench, "overlap", "--comm-ratios", "1e-300"),
        cmd("bench overlap --link-gbps 1e308", "--link-gbps", *bench, "overlap", "--link-gbps", "1e308"),
        cmd("bench overlap --link-gbps 1e-300", "--link-gbps", *bench, "overlap", "--link-gbps", "1e-300"),
        cmd("bench overlap --bytes 10**30 M", "--bytes", *bench, "overlap", "--bytes", big + "M"),
        cmd("bench overlap --ranks 2**40", "--ranks", *bench, "overlap", "--ranks", str(2**40)),
        cmd("bench overlap --comm-blocks 2**40", "--comm-blocks", *bench, "overlap", "--comm-blocks", str(2**40)),
        cmd("bench overlap --auto-threads 2048", "--auto-threads", *bench, "overlap", "--auto-threads", "2048"),
        cmd("bench overlap --auto-blocks 2**40", "--auto-blocks", *bench, "overlap", "--auto-blocks", str(2**40)),
        cmd("bench overlap --compute softmax:1e3", "--compute", *bench, "overlap", "--compute", "softmax:1e3"),
        cmd("bench overlap --compute softmax:8192:0", "--compute", *bench, "overlap", "--compute", "softmax:8192:0"),
        cmd("bench overlap --compute 5000 digits", "--compute",
            *bench, "overlap", "--compute", "softmax:" + "9" * 5000),
        cmd("bench overlap --compute lone surrogate", "--compute", *bench, "overlap", "--compute", "soft\udcffmax:8"),
        cmd("bench overlap --plots a file", "--plots", *bench, "overlap", "--plots", "{file}", setup=a_file),
        cmd("bench overlap --local-ranks 1 with --comm stand-in", "--local-ranks", *bench, "overlap", "--comm",
            "stand-in", "--local-ranks", "2"),
        cmd("bench host-cost --calls 10**30", "--calls", *bench, "host-cost", "--calls", big),
        cmd("bench host-cost --batches 10**30", "--batches", *bench, "host-cost", "--batches", big),
        cmd("bench torch --timeout 1e308", "--timeout", *bench, "torch", "--timeout", "1e308", timeout=60),
        cmd("bench torch --timeout 10**30 (past threading's)", "--timeout", *bench, "torch", "--timeout", "1e30",
            timeout=60),
        cmd("bench torch --sms 10**11", "--sms", *bench, "torch", "--sms", "99999999999", timeout=60),
        cmd("bench torch --width 10**23", "--width", *bench, "torch", "--width", "9" * 23, timeout=60),
        cmd("bench torch --layers 10**12", "--layers", *bench, "torch", "--layers", "9" * 12, timeout=60),
        cmd("bench torch --steps 10**30", "--steps", *bench, "torch", "--steps", big, timeout=60),
        cmd("bench torch --warmup 10**30", "--warmup", *bench, "torch", "--warmup", big, timeout=60),
        cmd("bench torch --trial-steps 10**30", "--trial-steps", *bench, "torch", "--trial-steps", big, timeout=60),
        cmd("bench torch --bucket-mb 10**30", "--bucket-mb", *bench, "torch", "--bucket-mb", big, timeout=60),
        cmd("bench torch --configs bogus", "--configs", *bench, "torch", "--configs", "bogus", timeout=60),
        cmd("bench torch --policies bogus", "--policies", *bench, "torch", "--policies", "bogus", timeout=60),
        cmd("bench torch --steady 10**30", "--steady", *bench, "torch", "--steady", big, timeout=60),
        cmd("bench torch --fsdp-route tree", "--fsdp-route", *bench, "torch", "--fsdp-route", "tree", timeout=60),
        cmd("bench torch --fsdp-route custom without --fsdp", "--fsdp-route", *bench, "torch", "--fsdp-route", "custom",
            timeout=60),
        cmd("bench torch --policies prefetch without --fsdp", "prefetch", *bench, "torch", "--policies", "prefetch",
            timeout=60),
        cmd("bench torch --plots a file", "--plots", *bench, "torch", "--plots", "{file}", setup=a_file, timeout=60),
        cmd("bench torch --batch 10**30", "--batch", *bench, "torch", "--batch", big, timeout=60),
        cmd("bench torch --seq 7", "--seq", *bench, "torch", "--seq", "7", timeout=60),
        cmd("bench torch --profile a file", "--profile", *bench, "torch", "--profile", "{file}", setup=a_file,
            timeout=60),
        cmd("bench torch --policies zero-sm without FSDP2's custom route", "zero-sm", *bench, "torch", "--fsdp",
            "--policies", "zero-sm", timeout=60),
    ]
    # bench plot: results that pass the schema's first look
    plot = (*bench, "plot", "{results}")
    c += [
        cmd("plot: negative makespan", "makespan", *plot, setup=results(_set("runs.0.metrics.makespan_ms", -1.0))),
        cmd("plot: makespan 1e308", "makespan", *plot, setup=results(_set("runs.0.metrics.makespan_ms", 1e308))),
        cmd("plot: t_comp negative", "t_comp", *plot, setup=results(_set("runs.0.metrics.t_comp_ms", -5.0))),
        cmd("plot: t_comm 1e308", "t_comm", *plot, setup=results(_set("runs.0.metrics.t_comm_ms", 1e308))),
        cmd("plot: strings in a timeline row", "timeline", *plot,
            setup=results(_set("runs.0.timeline.compute", [["0", "1", "0"]]))),
        cmd("plot: infinite SM index", "timeline", *plot,
            setup=results(raw=_raw("runs.0.timeline.comm.0.2", "Infinity"))),
        cmd("plot: NaN start", "timeline", *plot, setup=results(raw=_raw("runs.0.timeline.compute.0.0", "NaN"))),
        cmd("plot: 1e999 end", "timeline", *plot, setup=results(raw=_raw("runs.0.timeline.compute.0.1", "1e999"))),
        cmd("plot: end 1e308", "timeline", *plot, setup=results(_set("runs.0.timeline.compute.0.1", 1e308))),
        cmd("plot: end before start", "timeline",
            *plot, setup=results(_set("runs.0.timeline.compute.0", [1.0, 0.5, 0]))),
        cmd("plot: negative start", "timeline",
            *plot, setup=results(_set("runs.0.timeline.compute.0", [-1.0, 0.5, 0]))),
        cmd("plot: SM index 1.5", "timeline", *plot, setup=results(_set("runs.0.timeline.comm.0.2", 1.5))),
        cmd("plot: SM index -2 (-1: not known)", "timeline",
            *plot, setup=results(_set("runs.0.timeline.comm.0.2", -2))),
        cmd("plot: SM index beyond num_sms", "timeline", *plot, setup=results(_set("runs.0.timeline.comm.0.2", 4))),
        cmd("plot: SM index 10**400, no num_sms", "timeline", *plot,
            setup=results(raw=_raw("runs.0.timeline.comm.0.2", "1" + "0" * 400)
                          .replace('"num_sms": 4', '"num_sms": null'))),
        cmd("plot: SM index true", "timeline", *plot, setup=results(_set("runs.0.timeline.comm.0.2", True))),
        cmd("plot: num_sms 10**400", "num_sms", *plot, setup=results(raw=_raw("device.num_sms", "1" + "0" * 400))),
        cmd("plot: num_sms 10**9", "num_sms", *plot, setup=results(_set("device.num_sms", 10**9))),
        cmd("plot: reduction a string", "reduction", *plot, setup=results(_set("runs.0.metrics.reduction", "lots"))),
        cmd("plot: reduction NaN", "reduction", *plot, setup=results(raw=_raw("runs.0.metrics.reduction", "NaN"))),
        cmd("plot: model_ms NaN", "model_ms", *plot,
            setup=results(raw=json.dumps({**_good_results(), "summary": [{"workload": "w", "model_ms": "@@"}]})
                          .replace('"@@"', "NaN"))),
        cmd("plot: model_ms 1e308", "model_ms", *plot,
            setup=results(lambda d: d.update(summary=[{"workload": "w", "model_ms": 1e308}]))),
        cmd("plot: model_ms true", "model_ms", *plot,
            setup=results(lambda d: d.update(summary=[{"workload": "w", "model_ms": True}]))),
        cmd("plot: timeline_blocks strings", "timeline_blocks", *plot,
            setup=results(_set("runs.0.timeline_blocks", {"compute": "many"}))),
        cmd("plot: timeline rows of 4", "timeline", *plot,
            setup=results(_set("runs.0.timeline.compute", [[0.0, 1.0, 0, 7]]))),
        cmd("plot: a timeline kind missing", "timeline",
            *plot, setup=results(_set("runs.0.timeline", {"compute": []}))),
        cmd("plot: workload label 100000 characters", "workload", *plot,
            setup=results(lambda d: [r.update(workload="w" * 100000) for r in d["runs"]])),
        cmd("plot: describe a number", "describe", *plot, setup=results(_set("runs.0.describe", 5))),
        cmd("plot: results a FIFO", "regular file", *bench, "plot", "{fifo}", setup=fifo),
        cmd("plot: results /dev/zero", "/dev/zero", *bench, "plot", "/dev/zero"),
        cmd("plot: results nested 100000 deep", "json", *plot, setup=results(raw="[" * 100000)),
        cmd("plot: results not UTF-8", "json", *plot, setup=results(raw=b"\xff\xfe{")),
        cmd("plot: --out a file", "--out", *plot, "--out", "{results}", setup=results()),
    ]
    # Issue 33: the torch overlap's arguments (checked before the DDP: object() stands where it would go),
    # options that mean something only with another, name expressions, the choice cache, timeouts.
    ov = "import numpy as np, shimrt.torch\nshimrt.torch.overlap(object(), {})"
    for label, arg, needle in (
            ("policy np.array of two", "policy=np.array(['priority', 'ddp'])", "policy"),
            ("policy np.array(['auto'])", "policy=np.array(['auto'])", "policy"),
            ("policy bytes", "policy=b'auto'", "policy"), ("policy None", "policy=None", "policy"),
            ("policy 3", "policy=3", "policy"), ("policy sequential", "policy='sequential'", "sequential"),
            ("policy auto:2", "policy='auto:2'", "policy"), ("policy partition:0", "policy='partition:0'", "partition"),
            ("policy partition:10**6", "policy='partition:1000000'", "partition"),
            ("policy shaping:65", "policy='shaping:65'", "shaping"),
            ("policy carveout:-1", "policy='carveout:-1'", "carveout"),
            ("policy priority:2", "policy='priority:2'", "priority"),
            ("policy ctas:65", "policy='ctas:65'", "ctas"), ("policy prefetch:0", "policy='prefetch:0'", "prefetch"),
            ("policy prefetch:9", "policy='prefetch:9'", "prefetch"), ("fsdp_route 'tree'", "fsdp_route='tree'",
                                                                       "fsdp_route"),
            ("fsdp_route None", "fsdp_route=None", "fsdp_route"),
            ("policy ' priority'", "policy=' priority'", "policy"),
            ("sms [32, 32]", "sms=[32, 32]", "sms"), ("sms [10**6]", "sms=[10**6]", "sms"),
            ("sms [0]", "sms=[0]", "sms"), ("sms []", "sms=[]", "sms"), ("sms '32'", "sms='32'", "sms"),
            ("sms [True]", "sms=[True]", "sms"), ("sms [1.5]", "sms=[1.5]", "sms"), ("sms 32", "sms=32", "sms"),
            ("sms {32: 1}", "sms={32: 1}", "sms"), ("sms np.array 2-D", "sms=np.array([[32]])", "sms"),
            ("trial_steps 0", "trial_steps=0", "trial_steps"),
            ("trial_steps 10**6", "trial_steps=10**6", "trial_steps"),
            ("trial_steps 1.5", "trial_steps=1.5", "trial_steps"),
            ("trial_steps True", "trial_steps=True", "trial_steps"),
            ("margin nan", "margin=float('nan')", "margin"), ("margin inf", "margin=float('inf')", "margin"),
            ("margin -0.1", "margin=-0.1", "margin"), ("margin 0.6", "margin=0.6", "margin"),
            ("margin '0.1'", "margin='0.1'", "margin"),
            ("timeout inf", "timeout=float('inf')", "timeout"), ("timeout nan", "timeout=float('nan')", "timeout"),
            ("timeout 0", "timeout=0", "timeout"), ("timeout -1", "timeout=-1", "timeout"),
            ("timeout '5'", "timeout='5'", "timeout"), ("timeout True", "timeout=True", "timeout"),
            ("timeout 10**400", "timeout=10**400", "timeout"),
            ("ddp object()", "policy='priority'", "DistributedDataParallel")):
        if label.startswith(("sms", "trial_steps", "margin")):  # auto's options: an Auto, checked where made
            label, arg = f"Auto {label}", f"policy=shimrt.torch.Auto({arg})"
        c.append(api(f"overlap {label}", needle, ov.format(arg)))
    bench = ("-m", "shimrt.bench")
    c += [
        cmd("bench collectives --mixed-nccl without --torch", ("--mixed-nccl", "--torch"),
            *bench, "collectives", "--mixed-nccl"),
        cmd("bench collectives --latency-calls without --torch", ("--latency-calls", "--torch"),
            *bench, "collectives", "--latency-calls", "10"),
        cmd("bench torch --trial-steps without auto", "--trial-steps", *bench, "torch", "--trial-steps", "2",
            "--policies", "priority"),
        cmd("bench torch --sms 32,32", "--sms", *bench, "torch", "--sms", "32,32"),
        cmd("bench torch --sms 0", "--sms", *bench, "torch", "--sms", "0"),
        cmd("bench torch --sms 10**6", "--sms", *bench, "torch", "--sms", "1000000"),
        cmd("bench torch --loss-every -1", "--loss-every", *bench, "torch", "--loss-every", "-1"),
        cmd("bench torch --loss-every x", "--loss-every", *bench, "torch", "--loss-every", "x"),
        cmd("bench torch --optimizer adam", "--optimizer", *bench, "torch", "--optimizer", "adam"),
        cmd("bench torch --configs comm-heavy,comm-heavy", "--configs", *bench, "torch", "--configs",
            "comm-heavy,comm-heavy"),
        cmd("bench torch --bucket-mb 0", "--bucket-mb", *bench, "torch", "--bucket-mb", "0"),
        cmd("bench torch --loss-every 2 with ranks in one process", "--loss-every", *bench, "torch", "--loss-every",
            "2", "--local-ranks", "2"),
    ]
    src = "import shimrt\nsrc = 'template <typename T> __global__ void k(T* x) {}'\n"
    for label, arg, needle in (
            ("a str", "'k<float>'", "name_expressions"), ("None", "None", "name_expressions"),
            ("a set", "{'k<float>'}", "name_expressions"), ("twice", "['k<float>', 'k<float>']", "once"),
            ("empty", "['']", "name expression"), ("NUL", "['k\\0']", "name expression"),
            ("bytes", "[b'k<float>']", "name expression"), ("lone surrogate", "['k\\ud800']", "name expression"),
            ("no such kernel", "['nothing<int>']", "nothing<int>")):
        c.append(api(f"compile name_expressions {label}", needle,
                     src + f"shimrt.compile(src, 'sm_90', name_expressions={arg}, cache=False)"))
    prog = src + "p = shimrt.compile(src, 'sm_90', name_expressions=['k<float>'], cache=False)\n"
    c += [api("Program.kernel unknown expression", "k<int>", prog + "p.kernel('k<int>')"),
          api("Program.kernel None", "kernel", prog + "p.kernel(None)"),
          api("Program.kernel a list", "kernel", prog + "p.kernel(['k<float>'])")]
    return c


# --- running and judging ------------------------------------------------------------------------

def _base_env(root: Path = ROOT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHIMRT_", "NCCL_", "OMPI_", "PMI_", "MPI_", "CUDA_MPS_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # No GPU for the cases, wherever the sweep runs: a value taken then ends in "no GPU available".
    env.update(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="", ROCR_VISIBLE_DEVICES="",
               PYTHONPATH=str(root) + os.pathsep + env.get("PYTHONPATH", ""), PYTHONDONTWRITEBYTECODE="1")
    return env


def _message_lines(stderr: str) -> list[str]:
    """stderr's lines without argparse's usage block (``usage:`` and its indented continuation)."""
    lines, in_usage = [], False
    for line in stderr.splitlines():
        if line.startswith("usage:"):
            in_usage = True
            continue
        if in_usage and line.startswith(" "):
            continue
        in_usage = False
        if line.strip():
            lines.append(line)
    return lines


def judge(case: Case, rc: int | None, out: str, err: str) -> tuple[str, str]:
    """(category, what to show) of one case's run."""
    needles = (case.needle,) if isinstance(case.needle, str) else case.needle

    def names(text: str) -> bool:
        return any(n.lower() in text.lower() for n in needles)
    if rc is None:
        return "hang", "ran past the timeout"
    if rc < 0:
        return "crash", f"killed by signal {-rc}: " + (err.strip().splitlines() or [""])[-1][:300]
    if "Traceback (most recent call last)" in err or "Traceback (most recent call last)" in out:
        return "traceback", err.strip().splitlines()[-1][:300] if err.strip() else out[-300:]
    if case.code is not None:
        if rc == 3:
            message = out.strip().splitlines()[-1][len("REFUSED "):]
            return ("clean" if names(message) else "unclear"), message[:300]
        if rc == 0:
            return "taken", "returned without an error"
        return "traceback", f"exit code {rc}: {err.strip()[-300:]}"
    if case.reports is not None and rc in (0, 1):
        said = [line for line in (out if case.reports == "stdout" else err).splitlines() if names(line)]
        if said:
            return "clean", f"exit code {rc}, {case.reports} says: {said[0].strip()[:250]}"
    lines = _message_lines(err)
    shown = " | ".join(lines)[:300]
    if rc == 0:
        return "taken", "exit code 0" + (f": {shown}" if shown else "")
    if rc == 2 and len(lines) == 1:
        if names(lines[0]):
            return "clean", shown
        return "taken" if "no GPU" in lines[0] or "GPU" in lines[0] else "unclear", shown
    return ("taken" if "no GPU" in err else "unclear"), f"exit code {rc}, {len(lines)} line(s): {shown}"


def _fill(text: str, fields: dict) -> str:
    """``text`` with each ``{name}`` of ``fields`` replaced (no other braces are touched)."""
    for name, value in fields.items():
        text = text.replace("{" + name + "}", value)
    return text


def run_case(case: Case, root: Path, timeout: float) -> tuple[str, str, float]:
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp_name:
        tmp = Path(tmp_name)
        fields = {"tmp": str(tmp)}
        if case.setup is not None:
            fields.update(case.setup(tmp))
        env = _base_env(root)
        env["SHIMRT_CACHE_DIR"] = str(CACHE)
        env.update({k: _fill(v, fields) for k, v in case.env.items()})
        for k in [k for k, v in env.items() if v == "" and k in ("SHIMRT_CACHE_DIR", "XDG_CACHE_HOME")]:
            del env[k]  # "" in a case means: unset
        if case.code is not None:
            argv = [sys.executable, "-c", HARNESS, _fill(case.code, fields)]
        else:
            argv = [sys.executable, *[_fill(a, fields) for a in case.argv]]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=case.timeout or timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            rc = None
        finally:
            if proc.poll() is None:
                proc.kill()
        elapsed = time.monotonic() - t0
        category, shown = judge(case, rc, out.decode(errors="replace"), err.decode(errors="replace"))
        return category, shown, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=max(2, os.cpu_count() or 2), help="cases run at once")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a case may run (default 20)")
    parser.add_argument("--only", default=None, help="run only the cases whose name holds this text")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose shimrt is swept")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--verbose", action="store_true", help="print every case, clean ones too")
    args = parser.parse_args()
    todo = [c for c in cases() if args.only is None or args.only.lower() in c.name.lower()]
    if args.list:
        for c in todo:
            print(c.name)
        print(f"{len(todo)} cases")
        return 0
    global NCCL, CACHE
    NCCL = _nccl_path()
    cache = tempfile.mkdtemp(prefix="sweep-cache-")
    CACHE = Path(cache)
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            done = list(pool.map(lambda c: (c, *run_case(c, args.root.resolve(), args.timeout)), todo))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    counts = {k: 0 for k in CATEGORIES}
    for case, category, shown, elapsed in done:
        counts[category] += 1
        if category != "clean" or args.verbose:
            print(f"[{category:9s}] {case.name} ({elapsed:.1f} s): {shown}")
    print(f"\n{len(done)} cases in {time.monotonic() - t0:.0f} s: "
          + ", ".join(f"{counts[k]} {k}" for k in CATEGORIES))
    return 0 if counts["clean"] == len(done) else 1


NCCL = ""
CACHE = Path()

if __name__ == "__main__":
    sys.exit(main())
