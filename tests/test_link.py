"""The socket link (shimrt.nccl.link) on the CPU: the NCCL variables that make each rank a host of
its own, set for every rank by the launcher (real processes) or in-process by use_link, refused
where they would clash with the environment's, and the shared-GPU check that follows them. The
GPU runs over it are tests/gpu/test_multirank.py's."""

from __future__ import annotations

import json

import pytest
from test_launch import clean_env, launch_cmd, nccl, rank_lines  # noqa: F401 - nccl is a fixture

from shimrt import CollectiveError, UsageError
from shimrt.config import given
from shimrt.nccl.config import check_shared_gpu
from shimrt.nccl.link import LINKS, link_env, use_link

SOCKET = {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


def test_the_socket_link_makes_each_rank_a_host_of_its_own_and_native_sets_nothing():
    assert LINKS == ("native", "socket")
    assert link_env("native", 3) == {}
    zero, one = link_env("socket", 0), link_env("socket", 1)
    assert {k: v for k, v in zero.items() if k != "NCCL_HOSTID"} == SOCKET
    assert zero["NCCL_HOSTID"] != one["NCCL_HOSTID"]
    with pytest.raises(UsageError, match="link must be one of native, socket"):
        link_env("ib", 0)
    with pytest.raises(UsageError, match="rank must be an int"):
        link_env("socket", -1)


def test_use_link_sets_the_variables_and_refuses_one_the_environment_sets_otherwise(monkeypatch):
    for name in (*SOCKET, "NCCL_HOSTID"):  # set then removed: monkeypatch puts back what was there after
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    assert use_link("socket", 1) == link_env("socket", 1)
    assert given(link_env("socket", 1)) == link_env("socket", 1)
    assert use_link("socket", 1)  # the same again: nothing clashes
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    with pytest.raises(UsageError, match="sets NCCL_SOCKET_IFNAME=lo, but the environment already has "
                                         "NCCL_SOCKET_IFNAME=eth0"):
        use_link("socket", 1)
    with pytest.raises(UsageError, match="NCCL_FOO is not a variable shimrt reads"):
        given(["NCCL_FOO"])


class _Nccl:
    """What check_shared_gpu reads of a library: its version (2.28.9: it refuses a shared GPU)."""
    version, version_text, path = 22809, "2.28.9", "libnccl.so.2"


def test_ranks_that_name_hosts_of_their_own_share_no_gpu_in_nccls_eyes(monkeypatch):
    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    with pytest.raises(CollectiveError, match="refuses"):
        check_shared_gpu(_Nccl(), "cuda", "two ranks", process_per_rank=True)
    monkeypatch.setenv("NCCL_HOSTID", "shimrt-link-rank-0")
    check_shared_gpu(_Nccl(), "cuda", "two ranks", process_per_rank=True)
    with pytest.raises(CollectiveError, match="refuses"):  # ranks of one process share its host id
        check_shared_gpu(_Nccl(), "cuda", "two ranks")


ENV_PROBE = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
             "('NCCL_HOSTID', 'NCCL_NET', 'NCCL_SOCKET_IFNAME', 'NCCL_IB_DISABLE')}))")


def test_the_launcher_gives_every_rank_the_links_variables(nccl, tmp_path):  # noqa: F811
    probe = tmp_path / "env_probe.py"
    probe.write_text(ENV_PROBE + "\n")
    env = {k: v for k, v in clean_env().items() if k not in (*SOCKET, "NCCL_HOSTID")}
    run = launch_cmd("--nproc", "2", "--link", "socket", str(probe), env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    got = {r: json.loads(lines[-1]) for r, lines in rank_lines(run.stdout).items()}
    assert got == {r: link_env("socket", r) for r in (0, 1)}
    native = launch_cmd("--nproc", "1", str(probe), env=env)
    assert json.loads(rank_lines(native.stdout)[0][-1]) == dict.fromkeys(got[0])  # native: none set


def test_the_launcher_refuses_a_link_the_environment_contradicts(nccl, tmp_path):  # noqa: F811
    probe = tmp_path / "env_probe.py"
    probe.write_text(ENV_PROBE + "\n")
    run = launch_cmd("--nproc", "2", "--link", "socket", str(probe),
                     env=dict(clean_env(), NCCL_SOCKET_IFNAME="eth0"))
    assert run.returncode == 2 and "[rank" not in run.stdout, run.stdout
    assert "--link socket sets NCCL's NCCL_SOCKET_IFNAME, which this environment sets already " \
           "(NCCL_SOCKET_IFNAME=eth0)" in run.stderr and "Traceback" not in run.stderr
    same = launch_cmd("--nproc", "1", "--link", "socket", str(probe), env=dict(clean_env(), NCCL_NET="Socket"))
    assert same.returncode == 0, same.stderr  # the same value: nothing clashes
    bad = launch_cmd("--nproc", "2", "--link", "ib", str(probe))
    assert bad.returncode == 2 and "invalid choice: 'ib'" in bad.stderr


def test_the_process_says_which_link_it_is_on(monkeypatch):
    from shimrt.nccl.link import link_of_process
    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    assert link_of_process() is None
    monkeypatch.setenv("NCCL_HOSTID", link_env("socket", 1)["NCCL_HOSTID"])
    assert link_of_process() == "socket"
    monkeypatch.setenv("NCCL_HOSTID", "my-pod-7")  # a user's own host id: not shimrt's link
    assert link_of_process() is None
