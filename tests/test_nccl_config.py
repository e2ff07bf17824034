"""ncclConfig_t: shimrt's layout equals the C compiler's for the installed nccl.h, and the
options fill it as NCCL_CONFIG_INITIALIZER would."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail

from shimrt import UsageError
from shimrt.nccl import config


def installed_header() -> Path | None:
    import importlib.util
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    for root in (spec.submodule_search_locations or []) if spec else []:
        h = Path(root) / "include" / "nccl.h"
        if h.is_file():
            return h
    return None


def c_layout(header: Path, workdir: Path) -> tuple[int, dict[str, tuple[int, int]], int]:
    """(NCCL_VERSION_CODE, {field: (offset, size)}, sizeof) of ncclConfig_t, from the C compiler.

    nccl.h pulls in CUDA's headers, so only its ncclConfig_t definition is compiled, on its own.
    """
    text = header.read_text()
    block = re.search(r"typedef struct ncclConfig_v\d+ \{.*?\} ncclConfig_t;", text, re.S).group(0)
    version = int(re.search(r"#define NCCL_VERSION_CODE (\d+)", text).group(1))
    body = block.split("{", 1)[1].rsplit("}", 1)[0]
    fields = re.findall(r"\**(\w+);", re.sub(r"/\*.*?\*/", "", body, flags=re.S))
    src = workdir / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n" + block + "\nint main(void) {\n" + "".join(
        f'  printf("{f} %zu %zu\\n", offsetof(ncclConfig_t, {f}), sizeof(((ncclConfig_t*)0)->{f}));\n'
        for f in fields) + '  printf("sizeof %zu 0\\n", sizeof(ncclConfig_t));\n  return 0;\n}\n')
    exe = workdir / "layout"
    subprocess.run(["gcc", "-o", str(exe), str(src)], check=True, timeout=120)
    rows = [line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                    check=True).stdout.splitlines()]
    layout = {name: (int(off), int(size)) for name, off, size in rows}
    return version, layout, layout.pop("sizeof")[0]


def test_layout_matches_the_installed_nccl_h(tmp_path):
    header = installed_header()
    if header is None or shutil.which("gcc") is None:
        skip_or_fail("nccl", "needs gcc and nccl.h from the nvidia-nccl wheel (pip install 'shimrt[nccl]')")
    version, layout, size = c_layout(header, tmp_path)
    cls = config.structure(version)
    ours = {name: (getattr(cls, name).offset, getattr(cls, name).size) for name, _ in cls._fields_}
    assert ours == layout
    assert ctypes.sizeof(cls) == size


def test_options_fill_the_config_like_the_initializer():
    version = 22809
    cfg = config.CommOptions(min_ctas=2, max_ctas=8, cta_policy="zero").build(version)
    assert (cfg.size, cfg.magic, cfg.version) == (ctypes.sizeof(config.structure(version)), 0xCAFEBEEF, version)
    assert (cfg.blocking, cfg.minCTAs, cfg.maxCTAs, cfg.CTAPolicy) == (1, 2, 8, 2)
    assert cfg.cgaClusterSize == cfg.splitShare == cfg.nvlinkCentricSched == config.UNDEF_INT
    assert cfg.netName is None and cfg.commName is None
    assert not hasattr(cfg, "graphUsageMode")  # a 2.29 field: not in 2.28's layout
    with pytest.raises(UsageError, match="2.27"):
        config.CommOptions(cta_policy="zero").build(22600)
    assert config.CommOptions(blocking=False).build(21700).blocking == 0


@pytest.mark.parametrize("bad", [dict(min_ctas=0), dict(max_ctas=65), dict(min_ctas=8, max_ctas=2),
                                 dict(cta_policy="fast"), dict(timeout=0), dict(cga_cluster_size=9)])
def test_bad_options_are_refused(bad):
    with pytest.raises(UsageError):
        config.CommOptions(**bad)


def test_ranks_sharing_a_gpu_are_refused_unless_the_nccl_in_use_allows_it(monkeypatch):
    """The rule NCCL applies ("Duplicate GPU detected" before 2.30; 2.30+ only with
    NCCL_MULTI_RANK_GPU_ENABLE), checked on the NCCL this machine loads and on an older one."""
    import dataclasses

    from shimrt import CollectiveError
    from shimrt.nccl import library
    from shimrt.nccl.config import check_shared_gpu
    try:
        lib = library.load()
    except CollectiveError as exc:
        skip_or_fail("nccl", f"NCCL does not load: {exc}")
    older = dataclasses.replace(lib, version=22809)
    for value in (None, "0", "no", "true"):  # NCCL reads an integer: anything but a non-zero one is off
        if value is None:
            monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
        else:
            monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", value)
        with pytest.raises(CollectiveError, match="NCCL 2.28.9 .* refuses; NCCL 2.30 or newer allows it"):
            check_shared_gpu(older, "cuda", "here")
        if lib.version >= 23000:
            with pytest.raises(CollectiveError, match="puts several ranks on one GPU: .*NCCL_MULTI_RANK_GPU_ENABLE=1"):
                check_shared_gpu(lib, "cuda", "here")
    for value in ("1", " 2 "):
        monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", value)
        with pytest.raises(CollectiveError, match="refuses"):
            check_shared_gpu(older, "cuda", "here")
        if lib.version >= 23000:
            check_shared_gpu(lib, "cuda", "here")  # allowed
    check_shared_gpu(older, "hip", "here")  # RCCL answers for itself
