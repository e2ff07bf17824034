"""The wheel carries kernels_src, and shimrt finds the sources inside an installed wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from shimrt import kernels

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, timeout=300)
    (path,) = out.glob("shimrt-*.whl")
    return path


def test_wheel_carries_every_kernel_source(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for source in kernels.names() + ["shimrt_portable.h"]:
        assert f"shimrt/kernels_src/{source}" in names


def test_sources_are_found_inside_an_unpacked_wheel(wheel, tmp_path):
    zipfile.ZipFile(wheel).extractall(tmp_path)
    code = ("import shimrt, pathlib; d = shimrt.kernels.directory(); "
            "assert d == pathlib.Path(shimrt.__file__).parent / 'kernels_src', d; "
            "print(len(shimrt.kernels.source('vector_ops')))")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == len(kernels.source("vector_ops"))


def test_wheel_carries_the_type_marker_and_the_license_pyproject_names(wheel):
    import email
    names = zipfile.ZipFile(wheel).namelist()
    assert "shimrt/py.typed" in names
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = email.message_from_bytes(zipfile.ZipFile(wheel).read(meta))
    assert "Apache-2.0" in (metadata.get("License") or metadata.get("License-Expression") or "")
    licenses = [n for n in names if "/licenses/" in n or n.endswith("dist-info/LICENSE")]
    assert licenses, names
    text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "Apache License" in (ROOT / "LICENSE").read_text()
