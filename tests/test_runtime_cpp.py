"""The C++ runtime builds against a real ncnn and MPI and passes its ctest suite; ensure_ncnn's
lookup order and cache behave without building anything.

The first run on a fresh machine builds ncnn's lean profile (about 2.5 minutes on 2 cores);
later runs reuse the cache under ~/.cache/autodice (or $AUTODICE_CACHE).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from rich.console import Console

from autodice import engine
from autodice.errors import AutodiceError

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.cpp
def test_runtime_builds_and_ctest_passes(tmp_path):
    ncnn = engine.ensure_ncnn(lean=True)
    build = tmp_path / "build"
    _run(["cmake", "-S", str(ROOT), "-B", str(build), *engine.cmake_args(ncnn)])
    _run(["cmake", "--build", str(build), "--parallel", str(os.cpu_count() or 1)])
    out = _run(["ctest", "--test-dir", str(build), "--output-on-failure"])
    summary = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", out)
    assert summary, out
    assert summary.group(2) == "0" and int(summary.group(3)) >= 5, out


def test_ncnn_dir_without_config_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODICE_NCNN_DIR", str(tmp_path))
    with pytest.raises(AutodiceError, match="AUTODICE_NCNN_DIR=.*ncnnConfig.cmake"):
        engine.ensure_ncnn()


def test_ncnn_dir_with_config_is_used_as_is(tmp_path, monkeypatch):
    (tmp_path / engine.CONFIG).parent.mkdir(parents=True)
    (tmp_path / engine.CONFIG).touch()
    monkeypatch.setenv("AUTODICE_NCNN_DIR", str(tmp_path))
    assert engine.ensure_ncnn(vulkan=True) == tmp_path.resolve()


def test_cache_hit_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODICE_NCNN_DIR", raising=False)
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path))
    key = engine.cache_key(engine.PROFILES["cpu"])
    config = tmp_path / "ncnn" / key / "install" / engine.CONFIG
    config.parent.mkdir(parents=True)
    config.touch()
    monkeypatch.setattr(engine, "_build", lambda *a: pytest.fail("must not build"))
    assert engine.ensure_ncnn() == tmp_path / "ncnn" / key / "install"


@pytest.mark.parametrize("name", sorted(engine.PROFILES))
def test_every_profile_keeps_xop_and_fma4_off(name):
    flags = engine.PROFILES[name]
    assert flags["NCNN_XOP"] == "OFF" and flags["NCNN_FMA4"] == "OFF"


def test_profiles_get_distinct_cache_entries():
    keys = {engine.cache_key(flags) for flags in engine.PROFILES.values()}
    assert len(keys) == len(engine.PROFILES)
    assert all(k.startswith(engine.NCNN_PIN + "-") for k in keys)
    assert engine.profile_name(vulkan=True, lean=False) == "vulkan"


def test_cmake_args_pin_mpi_and_ncnn(tmp_path):
    args = engine.cmake_args(tmp_path)
    assert f"-Dncnn_DIR={tmp_path / 'lib/cmake/ncnn'}" in args
    mpi_home = next(a for a in args if a.startswith("-DMPI_HOME="))
    assert (Path(mpi_home.split("=", 1)[1]) / "bin" / "mpicxx").exists()


def _fake_sdist(folder: Path, cmakelists: str) -> Path:
    """A tiny source package shaped like ncnn's: one top folder with a CMakeLists.txt."""
    top = folder / "fake-1"
    (top / "glslang").mkdir(parents=True)
    (top / "glslang" / "bundled.h").write_text("")
    (top / "ncnnConfig.cmake").write_text("set(ncnn_FOUND TRUE)\n")
    (top / "CMakeLists.txt").write_text(cmakelists)
    sdist = folder / "fake-1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(top, arcname="fake-1")
    return sdist


FAKE_OK = """cmake_minimum_required(VERSION 3.16)
project(fake NONE)
install(FILES ncnnConfig.cmake DESTINATION lib/cmake/ncnn)
"""


@pytest.mark.cpp
def test_build_installs_into_the_cache_atomically(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODICE_NCNN_DIR", raising=False)
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path / "cache"))
    sdist = _fake_sdist(tmp_path, FAKE_OK)
    monkeypatch.setattr(engine, "_download", lambda folder, console: sdist)
    prefix = engine.ensure_ncnn(vulkan=True, console=Console(file=io.StringIO()))
    entry = prefix.parent
    assert (prefix / engine.CONFIG).is_file()
    assert entry.name == engine.cache_key(engine.PROFILES["vulkan"])
    assert sorted(p.name for p in entry.iterdir()) == ["build.log", "install"]
    assert not list(entry.parent.glob(".tmp-*"))  # no leftovers beside the entry


@pytest.mark.cpp
def test_failed_build_leaves_no_entry_and_shows_the_log(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODICE_NCNN_DIR", raising=False)
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path / "cache"))
    sdist = _fake_sdist(tmp_path, 'project(fake NONE)\nmessage(FATAL_ERROR "boom in fake")\n')
    monkeypatch.setattr(engine, "_download", lambda folder, console: sdist)
    with pytest.raises(AutodiceError, match=r"(?s)failed while configuring.*boom in fake"):
        engine.ensure_ncnn(lean=True, console=Console(file=io.StringIO()))
    root = tmp_path / "cache" / "ncnn"
    key = engine.cache_key(engine.PROFILES["lean"])
    assert not (root / key).exists() and not list(root.glob(".tmp-*"))
    assert "boom in fake" in (root / f"{key}.failed.log").read_text()


def test_vulkan_unpack_leaves_out_bundled_glslang(tmp_path):
    sdist = _fake_sdist(tmp_path, FAKE_OK)
    top = engine._unpack(sdist, tmp_path / "with", skip_glslang=False)
    assert (top / "glslang" / "bundled.h").is_file()
    top = engine._unpack(sdist, tmp_path / "without", skip_glslang=True)
    assert (top / "CMakeLists.txt").is_file() and not (top / "glslang").exists()
