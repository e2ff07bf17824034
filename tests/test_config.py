"""Every environment variable shimrt reads: good values taken, bad ones refused naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shimrt import ShimrtError, UsageError
from shimrt.config import FOREIGN_LAUNCH_VARIABLES, VARIABLES, Settings, launch_env, settings

UID = "ab" * 128
SHIMRT = {"SHIMRT_RANK": "1", "SHIMRT_WORLD_SIZE": "2", "SHIMRT_LOCAL_RANK": "1", "SHIMRT_NCCL_UNIQUE_ID": UID}
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
PMI = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}


# --- settings() ------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [("cuda", "cuda"), ("hip", "hip"), ("CUDA", "cuda"), (" Hip ", "hip"),
                                             ("", None), ("  ", None)])
def test_backend_values(value, expected):
    assert settings({"SHIMRT_BACKEND": value}).backend == expected
    assert settings({}).backend is None


@pytest.mark.parametrize("value", ["xyz", "nccl", "cuda,hip", "1"])
def test_bad_backend_names_the_variable_and_the_choices(value):
    with pytest.raises(UsageError) as info:
        settings({"SHIMRT_BACKEND": value})
    assert str(info.value) == f"SHIMRT_BACKEND must be one of cuda, hip, not {value!r}"
    assert isinstance(info.value, ShimrtError)


@pytest.mark.parametrize("value", ["1", "true", "True", "TRUE", "yes", "Yes", "on", "ON", " 1 "])
def test_disable_cache_true(value):
    assert settings({"SHIMRT_DISABLE_CACHE": value}).cache_enabled is False


@pytest.mark.parametrize("value", ["0", "false", "False", "no", "NO", "off", "Off", "", " "])
def test_disable_cache_false_or_unset(value):
    assert settings({"SHIMRT_DISABLE_CACHE": value}).cache_enabled is True
    assert settings({}).cache_enabled is True


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "y", "t", "-1"])
def test_bad_disable_cache_names_the_variable_and_the_choices(value):
    with pytest.raises(UsageError, match=r"^SHIMRT_DISABLE_CACHE must be one of 1, true, yes, on, 0, false, no, off,"
                                         rf" not {value!r}$"):
        settings({"SHIMRT_DISABLE_CACHE": value})


def test_cache_dir(tmp_path):
    assert settings({"SHIMRT_CACHE_DIR": str(tmp_path / "c")}).cache_dir == tmp_path / "c"
    assert settings({"XDG_CACHE_HOME": str(tmp_path)}).cache_dir == tmp_path / "shimrt"
    # A relative XDG_CACHE_HOME is invalid (XDG spec) and ignored.
    assert settings({"XDG_CACHE_HOME": "rel"}).cache_dir == Path.home() / ".cache" / "shimrt"
    assert settings({"SHIMRT_CACHE_DIR": "~/x"}).cache_dir == Path.home() / "x"
    assert settings({"SHIMRT_CACHE_DIR": str(tmp_path)}).cache_dir == tmp_path
    assert settings({"SHIMRT_CACHE_DIR": str(tmp_path / "not-yet")}).cache_dir == tmp_path / "not-yet"
    assert settings({"SHIMRT_CACHE_DIR": "~", "HOME": str(tmp_path)}).cache_dir == tmp_path
    assert settings({"HOME": str(tmp_path)}).cache_dir == tmp_path / ".cache" / "shimrt"
    # A folder that cannot be written or made is the cache's to report (it never fails a compile).
    (tmp_path / "file").write_text("")
    assert settings({"SHIMRT_CACHE_DIR": str(tmp_path / "file" / "c")}).cache_dir == tmp_path / "file" / "c"


@pytest.mark.parametrize("value, message", [
    ("~nosuchuser/x", "SHIMRT_CACHE_DIR must be an absolute folder path (or one starting with ~ or ~user of a user "
                      "who exists), not '~nosuchuser/x': there is no user 'nosuchuser'"),
    ("rel/cache", "SHIMRT_CACHE_DIR must be an absolute folder path (or one starting with ~), not 'rel/cache': a "
                  "relative one would follow the working directory"),
    (".", "SHIMRT_CACHE_DIR must be an absolute folder path (or one starting with ~), not '.'"),
    ("~/x", "HOME must be an absolute path for the compile cache's default folder (~/.cache/shimrt), not 'home'"),
])
def test_bad_cache_dirs_are_refused_naming_the_variable(value, message):
    with pytest.raises(UsageError) as info:
        settings({"SHIMRT_CACHE_DIR": value, "HOME": "home"})
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("what", ["a file", "a device", "a dangling link"])
def test_a_cache_dir_that_exists_and_is_no_folder_is_refused_once(tmp_path, what):
    path = tmp_path / "cache"
    if what == "a file":
        path.write_text("")
    else:
        path.symlink_to("/dev/null" if what == "a device" else tmp_path / "nowhere")
    with pytest.raises(UsageError, match=f"^SHIMRT_CACHE_DIR must be a folder .*not '{path}', which is not a folder$"):
        settings({"SHIMRT_CACHE_DIR": str(path)})


@pytest.mark.parametrize("home", ["", "home", "./home"])
def test_the_default_cache_dir_needs_an_absolute_home(home, tmp_path):
    with pytest.raises(UsageError, match=f"^HOME must be an absolute path .*, not {home!r}: set SHIMRT_CACHE_DIR"):
        settings({"HOME": home})
    # XDG_CACHE_HOME (absolute) or SHIMRT_CACHE_DIR make HOME unneeded.
    assert settings({"HOME": home, "XDG_CACHE_HOME": str(tmp_path)}).cache_dir == tmp_path / "shimrt"
    assert settings({"HOME": home, "SHIMRT_CACHE_DIR": str(tmp_path)}).cache_dir == tmp_path


def test_a_relative_cache_dir_makes_no_folder_where_the_command_stands(tmp_path):
    """The issue's case: a relative SHIMRT_CACHE_DIR, once a folder made in the working directory,
    is one line and exit code 2, and nothing is made."""
    result = subprocess.run([sys.executable, "-m", "shimrt"], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "SHIMRT_CACHE_DIR": "rel/cache"}, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("shimrt: SHIMRT_CACHE_DIR must be an absolute folder path (or one starting with "
                                     "~), not 'rel/cache': a relative one would follow the working directory")
    assert not (tmp_path / "rel").exists()


def test_nccl_library_is_carried_never_refused(tmp_path):
    # Compiling kernels must work whatever SHIMRT_NCCL_LIBRARY says; the NCCL loader judges it.
    assert settings({"SHIMRT_NCCL_LIBRARY": "/nonexistent/libnccl.so.2"}).nccl_library == "/nonexistent/libnccl.so.2"
    assert settings({"SHIMRT_NCCL_LIBRARY": " "}).nccl_library is None
    assert settings({"SHIMRT_NCCL_LIBRARY": "~/libnccl.so.2"}).nccl_library == str(Path.home() / "libnccl.so.2")
    assert settings({"ROCM_PATH": "/opt/rocm"}).rocm_path == "/opt/rocm"


def test_mps_settings_are_carried_never_refused():
    # The MPS module judges the control program when --mps asks for it; nothing else needs it.
    assert settings({"SHIMRT_MPS_CONTROL": "/nonexistent/nvidia-cuda-mps-control"}).mps_control == \
        "/nonexistent/nvidia-cuda-mps-control"
    assert settings({"SHIMRT_MPS_CONTROL": "~/mps"}).mps_control == str(Path.home() / "mps")
    assert settings({"SHIMRT_MPS_CONTROL": " "}).mps_control is None and settings({}).mps_control is None
    assert settings({"CUDA_MPS_PIPE_DIRECTORY": " /tmp/p "}).mps_pipe_directory == "/tmp/p"
    assert settings({}).mps_pipe_directory is None


@pytest.mark.parametrize("value, expected", [("1", True), ("yes", True), ("0", False), ("", False), (None, False)])
def test_the_launchers_mps_mark_is_read(value, expected):
    env = dict(SHIMRT) if value is None else dict(SHIMRT, SHIMRT_MPS=value)
    assert launch_env(env).mps is expected
    assert launch_env({"RANK": "0", "WORLD_SIZE": "1", "SHIMRT_MPS": "1"}).mps is False  # shimrt's launcher's only


def test_a_bad_mps_mark_names_the_variable():
    with pytest.raises(UsageError, match="^SHIMRT_MPS must be one of 1, true, yes, on, 0, false, no, off, "
                                         "not 'maybe'$"):
        launch_env(dict(SHIMRT, SHIMRT_MPS="maybe"))


def test_settings_checks_direct_construction(tmp_path):
    with pytest.raises(UsageError, match="backend must be one of None, cuda, hip, not 'xyz'"):
        Settings(backend="xyz", cache_dir=tmp_path, cache_enabled=True)
    with pytest.raises(UsageError, match="cache_enabled must be True or False"):
        Settings(backend=None, cache_dir=tmp_path, cache_enabled="no")


def test_settings_reads_os_environ(monkeypatch):
    monkeypatch.setenv("SHIMRT_BACKEND", "HIP")
    assert settings().backend == "hip"
    monkeypatch.setenv("SHIMRT_DISABLE_CACHE", "perhaps")
    with pytest.raises(UsageError, match="SHIMRT_DISABLE_CACHE"):
        settings()


def test_every_variable_is_documented():
    for name in ("SHIMRT_BACKEND", "SHIMRT_CACHE_DIR", "SHIMRT_DISABLE_CACHE", "SHIMRT_NCCL_LIBRARY", "SHIMRT_RANK",
                 "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE", "SHIMRT_NCCL_UNIQUE_ID",
                 "SHIMRT_NCCL_UNIQUE_ID_ERROR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "SHIMRT_MPS_CONTROL", "SHIMRT_MPS", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        assert VARIABLES.get(name), name
    assert "LOCAL_WORLD_SIZE" in FOREIGN_LAUNCH_VARIABLES


# --- launch_env() ----------------------------------------------------------------------------

def test_good_launch_environments():
    env = launch_env(dict(SHIMRT, SHIMRT_LOCAL_WORLD_SIZE="2"))
    assert (env.source, env.rank, env.world_size, env.local_rank, env.local_world_size, env.unique_id) == \
        ("shimrt", 1, 2, 1, 2, bytes.fromhex(UID))
    assert launch_env(dict(SHIMRT, SHIMRT_NCCL_UNIQUE_ID=UID.upper())).unique_id == bytes.fromhex(UID)
    env = launch_env(dict(SHIMRT, SHIMRT_NCCL_UNIQUE_ID="", SHIMRT_NCCL_UNIQUE_ID_ERROR="no NCCL"))
    assert (env.unique_id, env.unique_id_error) == (None, "no NCCL")
    # shimrt's launcher sets torchrun's names too: its own are read first.
    env = launch_env(dict(SHIMRT, **TORCHRUN))
    assert (env.source, env.world_size) == ("shimrt", 2)
    env = launch_env(dict(TORCHRUN, MASTER_ADDR="node0", MASTER_PORT="29500"))
    assert (env.source, env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_addr,
            env.master_port) == ("torchrun", 1, 4, 1, 2, "node0", 29500)
    assert launch_env({"RANK": "0", "WORLD_SIZE": "1"}).local_rank == 0  # LOCAL_RANK unset
    for mpi in (OMPI, PMI):
        env = launch_env(mpi)
        assert (env.source, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("mpi", 1, 4, 1, 2)
    # Empty means unset; RANK alone is not a launch.
    assert launch_env({"SHIMRT_RANK": "", "RANK": "3"}).source is None
    assert launch_env({"RANK": " 3 ", "WORLD_SIZE": "+8"}).rank == 3


BAD_LAUNCHES = [
    # (environment, the message's start)
    (dict(SHIMRT, SHIMRT_RANK="x"), "SHIMRT_RANK (with SHIMRT_WORLD_SIZE=2) must be an int in 0..1, not 'x'"),
    (dict(SHIMRT, SHIMRT_RANK="5"), "SHIMRT_RANK (with SHIMRT_WORLD_SIZE=2) must be an int in 0..1, not 5"),
    (dict(SHIMRT, SHIMRT_RANK="-1"), "SHIMRT_RANK (with SHIMRT_WORLD_SIZE=2) must be an int in 0..1, not -1"),
    (dict(SHIMRT, SHIMRT_RANK="1.0"), "SHIMRT_RANK (with SHIMRT_WORLD_SIZE=2) must be an int in 0..1, not '1.0'"),
    (dict(SHIMRT, SHIMRT_RANK="1_0"), "SHIMRT_RANK (with SHIMRT_WORLD_SIZE=2) must be an int in 0..1, not '1_0'"),
    (dict(SHIMRT, SHIMRT_WORLD_SIZE="0"), "SHIMRT_WORLD_SIZE must be an int in 1..2147483647, not 0"),
    (dict(SHIMRT, SHIMRT_WORLD_SIZE="-3"), "SHIMRT_WORLD_SIZE must be an int in 1..2147483647, not -3"),
    (dict(SHIMRT, SHIMRT_WORLD_SIZE="two"), "SHIMRT_WORLD_SIZE must be an int in 1..2147483647, not 'two'"),
    # NCCL's rank count is a C int: a larger world passed the rendezvous before.
    (dict(SHIMRT, SHIMRT_WORLD_SIZE=str(2**31)), "SHIMRT_WORLD_SIZE must be an int in 1..2147483647, not 2147483648"),
    (dict(SHIMRT, SHIMRT_WORLD_SIZE="9" * 5000), "SHIMRT_WORLD_SIZE must be an int in 1..2147483647, not '9999"),
    ({"SHIMRT_WORLD_SIZE": "2"}, "SHIMRT_RANK must be set when SHIMRT_WORLD_SIZE is"),
    ({"SHIMRT_LOCAL_RANK": "0"}, "SHIMRT_RANK must be set when SHIMRT_LOCAL_RANK is"),
    ({"SHIMRT_NCCL_UNIQUE_ID": UID}, "SHIMRT_RANK must be set when SHIMRT_NCCL_UNIQUE_ID is"),
    ({"SHIMRT_MPS": "maybe"}, "SHIMRT_MPS must be one of 1, true, yes, on, 0, false, no, off, not 'maybe'"),
    ({"SHIMRT_DEVICES": str(2**31)}, "SHIMRT_DEVICES must be comma-separated GPU indices (integers in 0..2147483647"),
    ({"SHIMRT_DEVICES": "0,,1"}, "SHIMRT_DEVICES must be comma-separated GPU indices"),
    ({k: v for k, v in SHIMRT.items() if k != "SHIMRT_WORLD_SIZE"}, "SHIMRT_WORLD_SIZE must be set when SHIMRT_RANK"),
    ({k: v for k, v in SHIMRT.items() if k != "SHIMRT_LOCAL_RANK"}, "SHIMRT_LOCAL_RANK must be set when SHIMRT_RANK"),
    (dict(SHIMRT, SHIMRT_LOCAL_RANK="-1"), "SHIMRT_LOCAL_RANK (with SHIMRT_WORLD_SIZE=2) must be an int in 0..1"),
    (dict(SHIMRT, SHIMRT_LOCAL_RANK="2"), "SHIMRT_LOCAL_RANK (with SHIMRT_WORLD_SIZE=2) must be an int in 0..1"),
    (dict(SHIMRT, SHIMRT_LOCAL_WORLD_SIZE="1"),
     "SHIMRT_LOCAL_RANK (with SHIMRT_LOCAL_WORLD_SIZE=1) must be an int in 0..0, not 1"),
    (dict(SHIMRT, SHIMRT_LOCAL_WORLD_SIZE="3"),
     "SHIMRT_LOCAL_WORLD_SIZE (with SHIMRT_WORLD_SIZE=2) must be an int in 1..2, not 3"),
    (dict(SHIMRT, SHIMRT_LOCAL_WORLD_SIZE="0"), "SHIMRT_LOCAL_WORLD_SIZE (with SHIMRT_WORLD_SIZE=2) must be an int"),
    (dict(SHIMRT, SHIMRT_NCCL_UNIQUE_ID="abcd"), "SHIMRT_NCCL_UNIQUE_ID must be 256 hex digits (the 128-byte "
                                                 "ncclUniqueId), not 'abcd' (4 characters)"),
    (dict(SHIMRT, SHIMRT_NCCL_UNIQUE_ID="zz" * 128), "SHIMRT_NCCL_UNIQUE_ID must be 256 hex digits"),
    (dict(SHIMRT, SHIMRT_NCCL_UNIQUE_ID="ab" * 129), "SHIMRT_NCCL_UNIQUE_ID must be 256 hex digits"),
    (dict(TORCHRUN, RANK="4"), "RANK (with WORLD_SIZE=4) must be an int in 0..3, not 4"),
    (dict(TORCHRUN, RANK="-1"), "RANK (with WORLD_SIZE=4) must be an int in 0..3, not -1"),
    (dict(TORCHRUN, RANK="one"), "RANK (with WORLD_SIZE=4) must be an int in 0..3, not 'one'"),
    (dict(TORCHRUN, WORLD_SIZE="0"), "WORLD_SIZE must be an int in 1..2147483647, not 0"),
    (dict(TORCHRUN, WORLD_SIZE="-2"), "WORLD_SIZE must be an int in 1..2147483647, not -2"),
    (dict(TORCHRUN, WORLD_SIZE=str(2**31)), "WORLD_SIZE must be an int in 1..2147483647, not 2147483648"),
    (dict(TORCHRUN, LOCAL_RANK="-1"), "LOCAL_RANK (with LOCAL_WORLD_SIZE=2) must be an int in 0..1, not -1"),
    (dict(TORCHRUN, LOCAL_RANK="2"), "LOCAL_RANK (with LOCAL_WORLD_SIZE=2) must be an int in 0..1, not 2"),
    (dict(TORCHRUN, LOCAL_RANK="x"), "LOCAL_RANK (with LOCAL_WORLD_SIZE=2) must be an int in 0..1, not 'x'"),
    (dict(TORCHRUN, LOCAL_WORLD_SIZE="0"), "LOCAL_WORLD_SIZE (with WORLD_SIZE=4) must be an int in 1..4, not 0"),
    (dict(TORCHRUN, LOCAL_WORLD_SIZE="8"), "LOCAL_WORLD_SIZE (with WORLD_SIZE=4) must be an int in 1..4, not 8"),
    (dict(TORCHRUN, MASTER_PORT="http"), "MASTER_PORT must be an int in 1..65535, not 'http'"),
    (dict(TORCHRUN, MASTER_PORT="70000"), "MASTER_PORT must be an int in 1..65535, not 70000"),
    (dict(OMPI, OMPI_COMM_WORLD_RANK="4"), "OMPI_COMM_WORLD_RANK (with OMPI_COMM_WORLD_SIZE=4) must be an int"),
    (dict(OMPI, OMPI_COMM_WORLD_SIZE="0"), "OMPI_COMM_WORLD_SIZE must be an int in 1..2147483647, not 0"),
    (dict(OMPI, OMPI_COMM_WORLD_LOCAL_RANK="-1"), "OMPI_COMM_WORLD_LOCAL_RANK (with OMPI_COMM_WORLD_LOCAL_SIZE=2)"),
    (dict(OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="x"), "OMPI_COMM_WORLD_LOCAL_SIZE (with OMPI_COMM_WORLD_SIZE=4)"),
    (dict(PMI, PMI_RANK="9"), "PMI_RANK (with PMI_SIZE=4) must be an int in 0..3, not 9"),
    (dict(PMI, PMI_SIZE="-4"), "PMI_SIZE must be an int in 1..2147483647, not -4"),
    (dict(PMI, MPI_LOCALRANKID="2"), "MPI_LOCALRANKID (with MPI_LOCALNRANKS=2) must be an int in 0..1, not 2"),
    (dict(PMI, MPI_LOCALNRANKS="5"), "MPI_LOCALNRANKS (with PMI_SIZE=4) must be an int in 1..4, not 5"),
]


@pytest.mark.parametrize("environ, message", BAD_LAUNCHES, ids=[m.split(" ")[0] + f"-{i}"
                                                               for i, (_, m) in enumerate(BAD_LAUNCHES)])
def test_bad_launch_environments_name_the_variable(environ, message):
    with pytest.raises(UsageError) as info:
        launch_env(environ)
    assert str(info.value).startswith(message), str(info.value)


def test_the_environment_page_lists_every_variable():
    from pathlib import Path

    from shimrt.config import VARIABLES
    table = (Path(__file__).resolve().parents[1] / "docs" / "environment.md").read_text()
    for name in VARIABLES:
        assert f"| `{name}` |" in table, name
