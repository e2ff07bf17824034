"""Every command line of shimrt, on the CPU: a bad value is refused as it is parsed (exit 2, a
message naming the option and what it allows, never a traceback), the former hangs end at once,
--version and --help work everywhere, and nccl-tests' size flags read K/M/G.

Most cases call a command's ``main(argv)`` in-process with the work itself replaced by a
recorder (so that a GPU machine runs no benchmark here); a few run the real entry points.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import require_matplotlib

import shimrt
from shimrt import __main__ as shimrt_main
from shimrt import cli, selftest
from shimrt.bench import __main__ as bench
from shimrt.bench import collectives, gemm, launch, overlap, plots, results
from shimrt.errors import NoDeviceError, ShimrtError, UsageError
from shimrt.overlap import footprint, planner
from shimrt.overlap.workloads import ComputeSpec

VERSION = f"shimrt {shimrt.__version__}"
# Every command: (python -m name, main, module whose docstring is its --help).
COMMANDS = {"shimrt": (shimrt_main.main, shimrt_main), "shimrt.bench": (bench.main, bench),
            "shimrt.selftest": (selftest.main, selftest), "shimrt.overlap.footprint": (footprint.main, footprint)}
SUBCOMMANDS = {"launch": launch, "collectives": collectives, "gemm": gemm, "overlap": overlap, "plot": plots}
# Without a GPU here, or with one hidden, a valid run ends in NoDeviceError.
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}


@pytest.fixture
def ran(monkeypatch):
    """The commands' work replaced by a recorder of the parsed options: a refused value must
    leave it empty, and nothing reaches a device."""
    calls = []

    def record(args):
        calls.append(args)
        return 0
    for module in SUBCOMMANDS.values():
        monkeypatch.setattr(module, "run", record)
    monkeypatch.setattr(selftest, "run", record)
    monkeypatch.setattr(footprint, "run", record)
    monkeypatch.delenv("SHIMRT_BACKEND", raising=False)
    return calls


def call(capsys, main, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, ran, main, argv, *needles):
    code, _, err = call(capsys, main, argv)
    assert code == 2, (argv, err)
    assert "Traceback" not in err
    assert not ran, f"{argv} was not refused before the run"
    for needle in needles:
        assert needle in err, (argv, needle, err)
    return err


def opt(option, value):
    """``option value`` as a person types it; a value that starts with "-" is attached, or argparse
    would take it for an option."""
    if not value.startswith("-"):
        return [option, value]
    return [f"{option}={value}"] if option.startswith("--") else [option + value]


def run_module(*argv, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# --- bad values, by class --------------------------------------------------------------------

BAD_INTEGERS = [
    # (subcommand, option, the name the message uses, bad values)
    ("collectives", "-f", "-f/--factor", ["1", "0", "-2", "abc", "2.5", ""]),
    ("collectives", "--factor", "-f/--factor", ["1", "0"]),
    ("collectives", "--stepfactor", "-f/--factor", ["1"]),
    ("collectives", "-n", "-n/--iters", ["0", "-1", "x", "1e3"]),
    ("collectives", "--iters", "-n/--iters", ["0"]),
    ("collectives", "-w", "-w/--warmup", ["-1", "x", "1.5"]),
    ("collectives", "--warmup", "-w/--warmup", ["-1"]),
    ("overlap", "--repeats", "--repeats", ["0", "-1", "abc", "2.0"]),
    ("overlap", "--ranks", "--ranks", ["1", "0", "-8", "x"]),
    ("overlap", "--comm-blocks", "--comm-blocks", ["0", "-1", "x"]),
    ("overlap", "--comm-threads", "--comm-threads", ["0", "31", "100", "1000", "672", "x"]),
    ("overlap", "--auto-threads", "--auto-threads", ["abc", "100", "1000", "256,x", "256,256", ","]),
    ("overlap", "--auto-blocks", "--auto-blocks", ["0", "x", "8,8"]),
    ("gemm", "--size", "--size", ["0", "100", "-128", "abc", "4096.0", "99999999999999"]),
    ("gemm", "--repeats", "--repeats", ["0", "x"]),
    ("gemm", "--warmup", "--warmup", ["-1", "x"]),
    ("launch", "--batch", "--batch", ["0", "x"]),
    ("launch", "--batches", "--batches", ["-1"]),
    ("launch", "--launches", "--launches", ["0", "1.5"]),
    ("launch", "--rounds", "--rounds", ["0"]),
    ("overlap", "--local-ranks", "--local-ranks", ["0", "-1", "65", "x", "1.5"]),
    ("overlap", "--auto-ctas", "--auto-ctas", ["0", "65", "x", "8,8", ","]),
    ("collectives", "--local-ranks", "--local-ranks", ["0", "65", "x"]),
    ("host-cost", "--calls", "--calls", ["0", "-1", "x"]),
    ("host-cost", "--batches", "--batches", ["0", "2.5"]),
    # Issue 24: counts beyond a C int (a typo, never a run that ends) and ints too long to convert.
    ("collectives", "-n", "-n/--iters", ["2147483648", "9" * 5000]),
    ("collectives", "-w", "-w/--warmup", ["2147483648"]),
    ("collectives", "-f", "-f/--factor", ["2147483648"]),
    ("collectives", "--latency-calls", "--latency-calls", ["2147483648", "0"]),
    ("overlap", "--repeats", "--repeats", ["2147483648"]),
    ("gemm", "--repeats", "--repeats", ["2147483648"]),
    ("gemm", "--warmup", "--warmup", ["2147483648"]),
    ("launch", "--batch", "--batch", ["2147483648"]),
    ("launch", "--launches", "--launches", ["9" * 30]),
    ("host-cost", "--calls", "--calls", ["2147483648"]),
    ("host-cost", "--batches", "--batches", ["2147483648"]),
    ("torch", "--steps", "--steps", ["2147483648"]),
    ("torch", "--warmup", "--warmup", ["2147483648"]),
    ("torch", "--trial-steps", "--trial-steps", ["2147483648"]),
    ("torch", "--bucket-mb", "--bucket-mb", ["2147483648"]),
    ("torch", "--width", "--width", ["9" * 23]),
    ("torch", "--layers", "--layers", ["2147483648"]),
    ("torch", "--sms", "--sms", ["1025", "99999999999"]),
    ("torch", "--local-ranks", "--local-ranks", ["65"]),
]


@pytest.mark.parametrize("command, option, name, value",
                         [(c, o, n, v) for c, o, n, values in BAD_INTEGERS for v in values])
def test_bad_integers_are_refused_naming_the_option(capsys, ran, command, option, name, value):
    err = refused(capsys, ran, bench.main, [command, *opt(option, value)], name)
    assert f"python -m shimrt.bench {command}: error:" in err
    assert " must " in err or " needs " in err  # what is allowed, in the words of the check


BAD_SIZES = [
    (bench.main, ["collectives", "-b"], "-b/--min-bytes", ["0", "-8", "1Q", "8X", "abc", "1.5M", "", "2T"]),
    (bench.main, ["collectives", "--min-bytes"], "-b/--min-bytes", ["0", "-8"]),
    (bench.main, ["collectives", "--minbytes"], "-b/--min-bytes", ["0"]),
    (bench.main, ["collectives", "-e"], "-e/--max-bytes", ["0", "-1", "256Q", "2T", "M"]),
    (bench.main, ["collectives", "--max-bytes"], "-e/--max-bytes", ["0"]),
    (bench.main, ["overlap", "--bytes"], "--bytes", ["abc", "8", "1.5M", "0", "-16M", "16M,16M", "1000000"]),
    (footprint.main, ["--bytes"], "--bytes", ["2", "0", "5G", "abc", "-4", "9" * 5000, "\u0664\u0660\u0669\u0666"]),
    (bench.main, ["collectives", "-b"], "-b/--min-bytes", ["\u0668"]),
    (bench.main, ["overlap", "--bytes"], "--bytes", ["9" * 30 + "M", "2T"]),
]


@pytest.mark.parametrize("main, argv, name, value",
                         [(m, a, n, v) for m, a, n, values in BAD_SIZES for v in values])
def test_bad_sizes_are_refused_naming_the_option(capsys, ran, main, argv, name, value):
    refused(capsys, ran, main, [*argv[:-1], *opt(argv[-1], value)], name, "must")


@pytest.mark.parametrize("option, value", [
    ("--comm-ratios", v) for v in ["abc", "0", "-1", "nan", "inf", ",", "1,1", "0.5,x"]] + [
    ("--link-gbps", v) for v in ["-1", "nan", "inf", "-inf", "abc", "", "1e308", "1e-300", "1e7"]] + [
    ("--comm-ratios", v) for v in ["1e308", "1e-300", "1001", "0.25,1e9"]])
def test_bad_numbers_are_refused_naming_the_option(capsys, ran, option, value):
    refused(capsys, ran, bench.main, ["overlap", *opt(option, value)], option, "must")


@pytest.mark.parametrize("command", ["torch", "host-cost"])
@pytest.mark.parametrize("value", ["1e308", "1e30", "inf", "0"])
def test_a_timeout_beyond_what_a_thread_can_wait_is_refused(capsys, ran, command, value):
    """The whole-run deadline (faulthandler's) takes at most threading.TIMEOUT_MAX seconds."""
    refused(capsys, ran, bench.main, [command, "--timeout", value], "--timeout must be a finite positive number <= ")


@pytest.mark.parametrize("value, says", [(v, "must be a finite positive number")
                                         for v in ["0", "-1", "nan", "inf", "1e9"]]
                         + [("x", "must be a number, not 'x'")])
def test_a_bad_collective_timeout_is_refused(capsys, ran, value, says):
    refused(capsys, ran, bench.main, ["torch", "--comm-timeout", value], f"--comm-timeout {says}")


@pytest.mark.parametrize("argv, needles", [
    (["collectives", "--ops", "foo"], ["--ops", "all_reduce, all_gather"]),
    (["collectives", "--ops", "all_reduce,bogus"], ["--ops", "not 'bogus'"]),
    (["collectives", "--ops", "all_reduce,all_reduce"], ["--ops", "once"]),
    (["collectives", "--ops", ""], ["--ops", "comma-separated"]),
    (["overlap", "--policies", "x"], ["--policies", ", ".join(planner.POLICIES)]),
    (["overlap", "--policies", "auto,auto"], ["--policies", "once"]),
    (["overlap", "--collective", "broadcast"], ["--collective", "all_reduce"]),
    (["overlap", "--comm", "x"], ["--comm", "stand-in"]),
    (["overlap", "--compute", "foo:1"], ["--compute", "sgemm, bias_gelu"]),
    (["overlap", "--compute", "sgemm"], ["--compute", "kind:size[:block]"]),
    (["overlap", "--compute", "sgemm:abc"], ["--compute", "kind:size[:block]"]),
    (["overlap", "--compute", "sgemm:-128"], ["--compute", "kind:size[:block]"]),
    (["overlap", "--compute", "sgemm:100"], ["--compute", "multiple of 128"]),
    (["overlap", "--compute", "sgemm:4096:128"], ["--compute", "256 threads"]),
    (["overlap", "--compute", "softmax:8192:2048"], ["--compute", "1..1024"]),
    (["overlap", "--compute", "softmax:0"], ["--compute", "positive"]),
    (["overlap", "--compute", "softmax:8192,softmax:8192"], ["--compute", "once"]),
    (["overlap", "--compute", "sgemm:4096:256:1"], ["--compute", "kind:size[:block]"]),
    (["bogus"], ["COMMAND", "collectives"]),
])
def test_unknown_choices_and_bad_specs_are_refused(capsys, ran, argv, needles):
    refused(capsys, ran, bench.main, argv, *needles)


def test_compute_specs_follow_computespec(capsys, ran):
    """The command line takes exactly what ComputeSpec takes, with the spec's own message."""
    assert overlap.compute_spec("softmax:8192:1024") == ComputeSpec("softmax", 8192, 1024)
    assert overlap.compute_spec(" sgemm:4096 ") == ComputeSpec("sgemm", 4096)
    with pytest.raises(UsageError) as exc:
        ComputeSpec("layernorm", 64, 4096)
    err = refused(capsys, ran, bench.main, ["overlap", "--compute", "layernorm:64:4096"])
    assert str(exc.value) in err


# --- files the run will write, and the plot's input ---------------------------------------------

def _output_cases(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return a_file, [
        (bench.main, ["collectives", "--json"]), (bench.main, ["gemm", "--json"]), (bench.main, ["launch", "--json"]),
        (bench.main, ["overlap", "--json"]), (footprint.main, ["--json"])]


@pytest.mark.parametrize("where", ["missing folder", "a folder", "under a file", "empty"])
def test_json_outputs_are_checked_before_the_run(capsys, ran, tmp_path, where):
    a_file, cases = _output_cases(tmp_path)
    path = {"missing folder": tmp_path / "nonexistent" / "dir" / "x.json", "a folder": tmp_path,
            "under a file": a_file / "x.json", "empty": ""}[where]
    for main, argv in cases:
        refused(capsys, ran, main, [*argv, path], "--json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_json_folder_is_refused(capsys, ran, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    refused(capsys, ran, bench.main, ["overlap", "--json", locked / "x.json"], "--json", "not writable")
    refused(capsys, ran, bench.main, ["overlap", "--plots", locked / "plots"], "--plots", "not writable")


@pytest.mark.parametrize("argv", [["overlap", "--plots"], ["plot", "r.json", "--out"]])
def test_an_existing_file_is_no_output_folder(capsys, ran, tmp_path, argv):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    name = argv[-1]
    refused(capsys, ran, bench.main, [*argv, a_file], name, "must be a folder")
    refused(capsys, ran, bench.main, [*argv, "/etc/passwd"], name, "must be a folder")
    refused(capsys, ran, bench.main, [*argv, a_file / "sub"], name, "is a file")
    refused(capsys, ran, bench.main, [*argv, ""], name)


def test_output_folders_that_can_be_made_are_taken(tmp_path):
    assert cli.writable_folder(str(tmp_path / "a" / "b"), "--out") == tmp_path / "a" / "b"
    assert cli.writable_folder(str(tmp_path), "--out") == tmp_path
    assert not (tmp_path / "a").exists()  # checked, not made


def _results():
    metrics = {"makespan_ms": 1.0, "t_comp_ms": 1.0, "t_comm_ms": 0.5}
    return {"schema": results.SCHEMA, "runs": [{"workload": "w", "policy": "sequential", "metrics": metrics,
                                              "timeline": {"compute": [[0.0, 1.0, 0]], "comm": []}}]}


def _broken(change):
    results = _results()
    change(results)
    return json.dumps(results)


BAD_RESULTS = {
    "not JSON": "this is not JSON",
    "not UTF-8": b"\xff\xfe\x00garbage",
    "empty": "",
    "deeply nested": "[" * 100000,
    "a list": "[1, 2]",
    "wrong schema": json.dumps({"schema": "other"}),
    "no runs": json.dumps({"schema": results.SCHEMA, "runs": []}),
    "runs not a list": _broken(lambda r: r.update(runs={"a": 1})),
    "run not an object": _broken(lambda r: r["runs"].append(3)),
    "no metrics": _broken(lambda r: r["runs"][0].pop("metrics")),
    "a string metric": _broken(lambda r: r["runs"][0]["metrics"].update(makespan_ms="1")),
    "a bool metric": _broken(lambda r: r["runs"][0]["metrics"].update(t_comp_ms=True)),
    "NaN metric": _broken(lambda r: r["runs"][0]["metrics"].update(t_comm_ms=math.nan)),
    "timeline not an object": _broken(lambda r: r["runs"][0].update(timeline=[1])),
    "bad timeline rows": _broken(lambda r: r["runs"][0]["timeline"].update(compute=[[0, 1]])),
    "no timeline": _broken(lambda r: r["runs"][0].pop("timeline")),
    "num_sms a string": _broken(lambda r: r.update(device={"num_sms": "132"})),
    "device a list": _broken(lambda r: r.update(device=[1])),
    "summary of strings": _broken(lambda r: r.update(summary=["x"])),
    "a duplicate run": _broken(lambda r: r["runs"].append(r["runs"][0])),
    # Issue 24: these raised (1e308, a string, an infinite SM index) or were drawn (a negative or
    # NaN time) after the schema's first look had passed them.
    "a negative makespan": _broken(lambda r: r["runs"][0]["metrics"].update(makespan_ms=-1.0)),
    "a makespan of 1e308": _broken(lambda r: r["runs"][0]["metrics"].update(makespan_ms=1e308)),
    "a string in a timeline": _broken(lambda r: r["runs"][0]["timeline"].update(compute=[["0", "1", "0"]])),
    "an infinite SM index": _broken(lambda r: r["runs"][0]["timeline"].update(comm=[[0.0, 1.0, math.inf]])),
    "a NaN start": _broken(lambda r: r["runs"][0]["timeline"].update(compute=[[math.nan, 1.0, 0]])),
    "a string reduction": _broken(lambda r: r["runs"][0]["metrics"].update(reduction="lots")),
    "an endless workload name": _broken(lambda r: [run.update(workload="w" * 100000) for run in r["runs"]]),
}


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_plot_refuses_bad_results_in_one_line(capsys, tmp_path, case):
    require_matplotlib()
    path = tmp_path / "r.json"
    content = BAD_RESULTS[case]
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = call(capsys, bench.main, ["plot", path, "--out", tmp_path / "out"])
    assert code == 2 and "Traceback" not in err
    assert err.startswith("shimrt.bench plot: ") and err.count("\n") == 1, err
    assert not list(tmp_path.glob("out/*.png"))


@pytest.mark.parametrize("what", ["missing", "a folder", "a device"])
def test_plot_refuses_what_is_no_results_file(capsys, tmp_path, what):
    path = {"missing": tmp_path / "missing.json", "a folder": tmp_path, "a device": "/dev/zero"}[what]
    code, _, err = call(capsys, bench.main, ["plot", path, "--out", tmp_path / "out"])
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"shimrt.bench plot: cannot read {path}")


# --- relations between options, checked before the run -------------------------------------------

@pytest.mark.parametrize("argv, needles", [
    (["collectives", "-b", "16", "-e", "8"], ["-e/--max-bytes must be at least -b/--min-bytes (16), not 8"]),
    (["collectives", "-b", "1M", "-e", "64K"], ["-e/--max-bytes", "(1048576)"]),
    (["overlap", "--bytes", "16M", "--comm-ratios", "1"], ["--comm-ratios", "not allowed with"]),
    (["overlap", "--collective", "send_recv"], ["--collective", "all_reduce, all_gather, reduce_scatter",
                                                "--comm nccl"]),
    (["overlap", "--comm", "stand-in", "--collective", "send_recv"], ["--collective"]),
    (["overlap", "--comm", "stand-in", "--local-ranks", "2"], ["--local-ranks is for --comm nccl"]),
    (["overlap", "--comm", "stand-in", "--stand-in-too"], ["--stand-in-too is for --comm nccl"]),
])
def test_options_that_do_not_go_together_are_refused(capsys, ran, argv, needles):
    refused(capsys, ran, bench.main, argv, *needles)


def test_plots_without_matplotlib_are_refused_before_the_run(capsys, ran, tmp_path, monkeypatch):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find(name, *a))
    for command in ("overlap", "torch"):
        refused(capsys, ran, bench.main, [command, "--plots", tmp_path / "p"], "--plots needs matplotlib",
                "shimrt[plot]")


def test_a_bad_environment_variable_is_one_line(capsys, ran, monkeypatch):
    monkeypatch.setenv("SHIMRT_BACKEND", "xyz")
    for main, argv in ((bench.main, ["overlap"]), (selftest.main, []), (footprint.main, [])):
        err = refused(capsys, ran, main, argv, "SHIMRT_BACKEND", "xyz")
        assert err.count("\n") == 1, err


# --- the former hangs, and the real entry points ------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["--factor", "1"], ["--factor", "0"], ["-f", "1"], ["--min-bytes", "0"],
                                  ["--min-bytes=-8"], ["-b", "0"], ["-b", "1", "-e", "1T", "-f", "1"]])
def test_former_hangs_fail_fast(argv):
    run = run_module("shimrt.bench", "collectives", *argv, timeout=30)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "must be" in run.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv", [
    ["shimrt.bench", "collectives", "-b", "8", "-e", "256M", "-f", "2"],
    ["shimrt.bench", "collectives", "--max-bytes", "268435456"],
    ["shimrt.bench", "overlap", "--quiet", "--compute", "bias_gelu:8192:1024,softmax:8192:1024",
     "--comm-threads", "256"],
    ["shimrt.bench", "launch"],
    ["shimrt.overlap.footprint"],
])
def test_valid_runs_without_a_gpu_end_in_one_line(argv, tmp_path):
    """With every GPU hidden, a valid run gets as far as opening one and says why it cannot."""
    run = run_module(*argv, "--json", tmp_path / "out.json", env=NO_GPU, timeout=100)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "no GPU" in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(" ".join(argv[:2]) if argv[0] == "shimrt.bench" else argv[0])
    assert not (tmp_path / "out.json").exists()


ISSUE_24_ENVIRONMENTS = {
    # (the environment, what the one line must say); each was a traceback, or taken, before.
    "~nosuchuser": ({"SHIMRT_CACHE_DIR": "~nosuchuser/x"}, "SHIMRT_CACHE_DIR must be an absolute folder path"),
    "relative cache": ({"SHIMRT_CACHE_DIR": "rel/cache"}, "a relative one would follow the working directory"),
    "/dev/null cache": ({"SHIMRT_CACHE_DIR": "/dev/null"}, "not '/dev/null', which is not a folder"),
    "bad SHIMRT_DEVICES": ({"SHIMRT_DEVICES": "abc"}, "SHIMRT_DEVICES must be comma-separated GPU indices"),
    "world beyond a C int": ({"SHIMRT_RANK": "0", "SHIMRT_WORLD_SIZE": str(2**31), "SHIMRT_LOCAL_RANK": "0"},
                             "SHIMRT_WORLD_SIZE must be an int in 1..2147483647, not 2147483648"),
    "a lone SHIMRT_WORLD_SIZE": ({"SHIMRT_WORLD_SIZE": "2"}, "SHIMRT_RANK must be set when SHIMRT_WORLD_SIZE is"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(ISSUE_24_ENVIRONMENTS))
@pytest.mark.parametrize("argv", [["shimrt"], ["shimrt.selftest", "--quiet"],
                                  ["shimrt.launch", "--nproc", "1", "-m", "shimrt"]])
def test_a_bad_environment_ends_every_command_in_one_line(argv, case, tmp_path):
    """Every command, the launcher and the selftest too (which exited 0 with a malformed
    SHIMRT_DEVICES), refuses before it runs; nothing is made where the command stands."""
    env, needle = ISSUE_24_ENVIRONMENTS[case]
    run = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=100, cwd=tmp_path,
                         env={**os.environ, "SHIMRT_CACHE_DIR": str(tmp_path / "cache"), **env})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith(f"{argv[0]}: ") and run.stderr.count("\n") == 1, run.stderr
    assert needle in run.stderr and run.stdout == ""
    assert not (tmp_path / "rel").exists()


@pytest.mark.timeout(60)
def test_selftest_with_a_bad_backend_is_one_line():
    run = run_module("shimrt.selftest", env={"SHIMRT_BACKEND": "xyz"}, timeout=50)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.startswith("shimrt.selftest: ") and "SHIMRT_BACKEND" in run.stderr
    assert run.stderr.count("\n") == 1 and run.stdout == ""


@pytest.mark.timeout(60)
def test_python_m_shimrt_lists_every_command():
    run = run_module("shimrt", timeout=50)
    assert run.returncode == 0 and run.stderr == ""
    listed = " ".join(run.stdout.split())
    for name, summary in shimrt_main.commands():
        assert name in run.stdout
        assert summary in listed
    for name in ("shimrt.selftest", "shimrt.launch", "shimrt.overlap.footprint", "shimrt.bench overlap",
                 "shimrt.bench collectives", "shimrt.bench gemm", "shimrt.bench launch", "shimrt.bench plot"):
        assert f"  {name} " in run.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["shimrt"], ["shimrt.bench"], ["shimrt.bench", "overlap"], ["shimrt.selftest"],
                                  ["shimrt.overlap.footprint"]])
def test_version_from_the_real_entry_points(argv):
    run = run_module(*argv, "--version", timeout=50)
    assert run.returncode == 0 and run.stdout.strip() == VERSION


# --- --version, --help, nccl-tests' sizes, in-process ------------------------------------------

def _every_command():
    yield from ((main, [], module) for main, module in COMMANDS.values())
    yield from ((bench.main, [name], module) for name, module in SUBCOMMANDS.items())


@pytest.mark.parametrize("main, argv, module", list(_every_command()))
def test_every_command_has_version_and_a_whole_help(capsys, ran, main, argv, module):
    code, out, _ = call(capsys, main, [*argv, "--version"])
    assert code == 0 and out.strip() == VERSION
    code, out, _ = call(capsys, main, [*argv, "--help"])
    assert code == 0 and not ran
    summary = cli.summary(module.__doc__)
    assert summary.endswith(".") and summary[0].isupper(), summary  # a sentence, not a fragment
    assert summary in " ".join(out.split())
    assert "``" not in out and ":class:" not in out  # markup is for the docs, not the terminal


def test_bench_help_lists_each_summary_whole(capsys, ran):
    code, out, _ = call(capsys, bench.main, ["--help"])
    text = " ".join(out.split())
    assert code == 0
    for module in SUBCOMMANDS.values():
        assert cli.summary(module.__doc__) in text


def test_python_m_shimrt_in_process(capsys, ran):
    code, out, err = call(capsys, shimrt_main.main, [])
    assert code == 0 and "shimrt.bench overlap" in out and not err
    code, _, err = call(capsys, shimrt_main.main, ["bogus"])
    assert code == 2 and "Traceback" not in err


def test_sizes_follow_nccl_tests():
    assert collectives.sizes(8, "256M", 2) == [8 << i for i in range(26)]
    assert collectives.sizes("8", "256M", 2)[-1] == 256 << 20
    assert collectives.sizes(8, 8 << 20, 4) == [8 << (2 * i) for i in range(11)]
    assert collectives.sizes("1K", "1K", 2) == [1024]
    assert collectives.sizes(3, 100, 4) == [3, 12, 48]
    assert collectives.sizes("1G", "1T", 1024) == [1 << 30, 1 << 40]
    for bad in [(0, 8, 2), (8, 4, 2), (8, 64, 1), (8, "2T", 2), (-8, 8, 2), ("1Q", 8, 2), (8, 64, True)]:
        with pytest.raises(UsageError):
            collectives.sizes(*bad)


@pytest.mark.parametrize("argv", [["-b", "8", "-e", "256M", "-f", "2"],
                                  ["--min-bytes", "8", "--max-bytes", "256M", "--factor", "2"],
                                  ["--minbytes", "8", "--maxbytes", "256MiB", "--stepfactor", "2"],
                                  ["-b", "8B", "-e", "268435456", "-f", "2"]])
def test_collectives_take_nccl_tests_flags(capsys, ran, argv):
    code, _, err = call(capsys, bench.main, ["collectives", *argv, "-n", "3", "-w", "0"])
    assert code == 0, err
    (args,) = ran
    assert (args.min_bytes, args.max_bytes, args.factor, args.iters, args.warmup) == (8, 256 << 20, 2, 3, 0)
    assert collectives.sizes(args.min_bytes, args.max_bytes, args.factor)[-1] == 256 << 20


def test_defaults_and_the_gpu_run_invocations_parse_as_before(capsys, ran, tmp_path):
    out = tmp_path / "x.json"
    for argv in (["collectives", "--max-bytes", "268435456", "--json", out], ["gemm", "--json", out],
                 ["launch", "--json", out], ["overlap", "--quiet", "--json", out],
                 ["overlap", "--quiet", "--compute", "bias_gelu:8192:1024,softmax:8192:1024", "--comm-threads", "256",
                  "--json", out]):
        code, _, err = call(capsys, bench.main, argv)
        assert code == 0, (argv, err)
    c, g, la, o, o256 = ran
    assert (c.min_bytes, c.max_bytes, c.factor, c.iters, c.warmup, c.ops) == \
        (8, 256 << 20, 4, 20, 5, list(collectives.COLLECTIVES))
    assert (g.size, g.repeats, g.warmup, str(g.json)) == (4096, 20, 3, str(out))
    assert (la.batch, la.batches, la.launches, la.rounds) == (200, 200, 20000, 5)
    assert o.compute == [ComputeSpec("sgemm", 4096), ComputeSpec("bias_gelu", 8192), ComputeSpec("softmax", 8192)]
    assert (o.comm_ratios, o.bytes, o.policies) == ([0.25, 1.0, 4.0], None, list(planner.POLICIES))
    assert (o.ranks, o.comm_blocks, o.comm_threads, o.link_gbps, o.auto_threads, o.auto_blocks, o.repeats) == \
        (8, 16, 512, 25.0, [256, 128], [8], 5)
    assert o256.compute == [ComputeSpec("bias_gelu", 8192, 1024), ComputeSpec("softmax", 8192, 1024)]
    assert o256.comm_threads == 256
    assert call(capsys, bench.main, ["overlap", "--bytes", "16MiB,1G", "--link-gbps", "0"])[0] == 0
    assert (ran[-1].bytes, ran[-1].comm_ratios, ran[-1].link_gbps) == ([16 << 20, 1 << 30], [0.25, 1.0, 4.0], 0.0)
    assert call(capsys, footprint.main, ["--bytes", "4K", "--json", out])[0] == 0
    assert ran[-1].bytes == 4096


# --- the wrapper every main goes through ---------------------------------------------------------

@pytest.mark.parametrize("error, code, needle", [
    (KeyboardInterrupt(), 130, "demo: interrupted"),
    (ShimrtError("it broke"), 2, "demo: it broke"),
    (NoDeviceError("no GPU available"), 2, "demo: no GPU available"),
    (UsageError("--x must be 1, not 2"), 2, "demo: --x must be 1, not 2"),
    (PermissionError(13, "Permission denied", "/out/x.json"), 2, "demo: /out/x.json: Permission denied"),
    (MemoryError(), 2, "demo: out of host memory"),
])
def test_errors_become_one_line_and_an_exit_code(capsys, monkeypatch, error, code, needle):
    monkeypatch.delenv("SHIMRT_BACKEND", raising=False)

    def fail(args):
        raise error
    got, out, err = call(capsys, lambda argv: cli.main(cli.parser("python -m demo", "Demo."), argv, fail), [])
    assert got == code and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_reader_that_left_is_no_error(capsys, monkeypatch):
    """``python -m shimrt.selftest | head``: exit 141 as a shell would say SIGPIPE, and no message."""
    monkeypatch.delenv("SHIMRT_BACKEND", raising=False)

    def fail(args):
        raise BrokenPipeError(32, "Broken pipe")
    code, _, err = call(capsys, lambda argv: cli.main(cli.parser("python -m demo", "Demo."), argv, fail), [])
    assert code == 141 and err == ""


def test_summary_and_description_drop_markup():
    doc = """Run :class:`~shimrt.Device` things, ``fast``
    and well.

    Details::

        code
    """
    assert cli.summary(doc) == "Run shimrt.Device things, fast and well."
    assert "Details:\n" in cli.description(doc) and "``" not in cli.description(doc)
    assert cli.size_text(4 << 30) == "4G" and cli.size_text(1 << 40) == "1T" and cli.size_text(1000) == "1000"


# --- the selftest's table ------------------------------------------------------------------------

def _checks():
    Check = selftest.Check
    return [Check("environment", "python", "pass", "Python 3"),
            Check("environment", "cuda-python", "skip", "not installed", "pip install 'shimrt[cuda]'"),
            Check("environment", "NVRTC", "skip", "no NVRTC library", "pip install 'shimrt[cuda]'"),
            Check("environment", "NCCL", "skip", "not found", "pip install 'shimrt[nccl]'"),
            *[Check("device", name, "skip", "no GPU: none here", "run on a machine with a GPU")
              for name in selftest.DEVICE_CHECKS],
            Check("communication", "library", "fail", "boom\n  at line 3")]


def test_selftest_table_says_a_shared_fix_once_per_section():
    text = selftest.table(_checks())
    assert text.count("run on a machine with a GPU") == 1
    assert text.count("no GPU: none here") == 1
    assert f"why (all {len(selftest.DEVICE_CHECKS)} above): no GPU: none here" in text
    for name in selftest.DEVICE_CHECKS:
        assert f"[SKIP] {name}\n" in text + "\n"
    assert text.count("pip install 'shimrt[cuda]'") == 1  # two checks, different reasons, one fix
    assert "[SKIP] cuda-python: not installed" in text and "[SKIP] NVRTC: no NVRTC library" in text
    assert "fix (all 2 above): pip install 'shimrt[cuda]'" in text
    assert "  [SKIP] NCCL: not found\n         fix: pip install 'shimrt[nccl]'" in text
    assert "[FAIL] library: boom\n           at line 3" in text
    assert text.endswith("1 passed, 1 failed, 10 skipped")


def test_selftest_json_keeps_every_fix(capsys, monkeypatch):
    monkeypatch.delenv("SHIMRT_BACKEND", raising=False)
    checks = _checks()
    monkeypatch.setattr(selftest, "check_environment", lambda results, progress: results.extend(checks))
    for name in ("check_compile", "check_communication"):
        monkeypatch.setattr(selftest, name, lambda *a: None)
    monkeypatch.setattr(selftest, "check_device", lambda results, progress: None)
    code, out, _ = call(capsys, selftest.main, ["--json", "--quiet"])
    assert code == 1  # one check failed
    results = json.loads(out)["results"]
    assert [r["fix"] for r in results] == [c.fix for c in checks]
    assert sum(r["fix"] == "run on a machine with a GPU" for r in results) == len(selftest.DEVICE_CHECKS)


def test_collectives_torch_needs_torch(capsys, ran):
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: --torch is taken")
    refused(capsys, ran, bench.main, ["collectives", "--torch"], "--torch needs torch", "shimrt[torch]")


def test_a_run_past_its_deadline_ends_with_every_threads_stack():
    """cli.deadline fires from faulthandler's own thread, also while the main thread waits in C."""
    import subprocess
    import sys
    code = ("import time; from shimrt import cli\n"
            "def stuck_here():\n    time.sleep(30)\n"
            "with cli.deadline(0.5):\n    stuck_here()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert run.returncode == 1 and "Timeout" in run.stderr and "stuck_here" in run.stderr, run.stderr


def test_a_deadline_that_is_not_reached_is_cancelled():
    """In a process of its own: a deadline that fired would end it (and here, pytest itself)."""
    import subprocess
    import sys
    code = ("import time; from shimrt import cli\n"
            "with cli.deadline(0.2):\n    pass\n"
            "time.sleep(0.4)\n")  # still alive after it: the dump was cancelled
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert run.returncode == 0 and run.stderr == "", run.stderr
