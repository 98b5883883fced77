"""Getting ncnn: the source package fetched from an index as pip is configured (real HTTP servers
on loopback, file:// indexes, find-links folders, a proxy), hash checks, the one build per CPU and
its cache, and a build that dies half-way leaving nothing trusted.

One test asks the real configured index (PyPI) for the pinned file into an empty cache: the step
that once broke for every new user while warm caches kept CI green.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from autodice.backend import engine, sdist
from autodice.core.errors import AutodiceError

QUIET = Console(file=io.StringIO())
NAME = "demo-1.0.tar.gz"


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def package(tmp_path):
    """(bytes, sha256) of a small file standing in for a source package."""
    data = os.urandom(200_000)
    return data, hashlib.sha256(data).hexdigest()


@contextmanager
def serve(routes: dict[str, tuple[str, bytes]], seen: list | None = None, auth: str | None = None):
    """An HTTP server on loopback: path (or absolute URI, for a proxy) -> (content type, body).

    ``seen`` collects (path, Accept header) of every request; with ``auth`` ("user:pw") a request
    without that Basic authorization gets 401.
    """
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if seen is not None:
                seen.append((self.path, self.headers.get("Accept")))
            if auth and self.headers.get("Authorization") != \
                    "Basic " + base64.b64encode(auth.encode()).decode():
                self.send_response(401)
                self.end_headers()
                return
            hit = routes.get(self.path)
            if hit is None:
                self.send_response(404)
                self.end_headers()
                return
            kind, body = hit
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(**kw) -> sdist.PipConfig:
    return sdist.PipConfig(**{"index_url": "http://127.0.0.1:1/none", "retries": 0,
                              "timeout": 5.0, **kw})


# --- fetching from an index -------------------------------------------------------------------


def test_json_simple_api_is_asked_for_and_the_file_verified(tmp_path, package):
    data, digest = package
    page = {"files": [{"filename": NAME, "url": "../../files/" + NAME,
                       "hashes": {"sha256": digest}}]}
    seen: list = []
    routes = {"/simple/demo/": ("application/vnd.pypi.simple.v1+json", json.dumps(page).encode()),
              "/files/" + NAME: ("application/octet-stream", data)}
    with serve(routes, seen) as url:
        got = sdist.fetch("demo", NAME, digest, tmp_path / "cache", QUIET,
                          config(index_url=url + "/simple"))
    assert got.read_bytes() == data
    assert seen[0][0] == "/simple/demo/"
    assert seen[0][1].startswith("application/vnd.pypi.simple.v1+json")
    assert sorted(p.name for p in got.parent.iterdir()) == [NAME]  # no temp file left


def test_html_simple_api_with_hash_fragment(tmp_path, package):
    data, digest = package
    html = f'<html><body><a href="/f/{NAME}#sha256={digest}">{NAME}</a></body></html>'
    routes = {"/simple/demo/": ("text/html", html.encode()), f"/f/{NAME}": ("x/y", data)}
    with serve(routes) as url:
        got = sdist.fetch("demo", NAME, digest, tmp_path, QUIET, config(index_url=url + "/simple"))
    assert got.read_bytes() == data


def test_extra_index_is_tried_after_the_main_one(tmp_path, package):
    data, digest = package
    html = f'<a href="{NAME}">{NAME}</a>'
    routes = {"/simple/demo/": ("text/html", html.encode()),
              f"/simple/demo/{NAME}": ("x/y", data)}
    with serve({}) as empty, serve(routes) as full:
        got = sdist.fetch("demo", NAME, digest, tmp_path, QUIET,
                          config(index_url=empty + "/simple", extra_index_urls=(full + "/simple",)))
    assert got.read_bytes() == data


def test_file_index_and_find_links_folder(tmp_path, package):
    data, digest = package
    files = tmp_path / "files"
    files.mkdir()
    (files / NAME).write_bytes(data)
    project = tmp_path / "simple" / "demo"
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<a href="../../files/{NAME}#sha256={digest}">x</a>')
    got = sdist.fetch("demo", NAME, digest, tmp_path / "c1", QUIET,
                      config(index_url=(tmp_path / "simple").as_uri()))
    assert got.read_bytes() == data
    got = sdist.fetch("demo", NAME, digest, tmp_path / "c2", QUIET,
                      config(no_index=True, find_links=(str(files),)))
    assert got.read_bytes() == data


def test_proxy_and_credentials_are_honoured(tmp_path, package):
    data, digest = package
    html = f'<a href="http://index.invalid/f/{NAME}">x</a>'
    # A proxy is sent the absolute URI: answering it proves the request went through the proxy
    # (index.invalid itself cannot resolve).
    routes = {"http://index.invalid/simple/demo/": ("text/html", html.encode()),
              f"http://index.invalid/f/{NAME}": ("x/y", data)}
    with serve(routes, auth="me:s3cret") as proxy:
        got = sdist.fetch("demo", NAME, digest, tmp_path, QUIET,
                          config(index_url="http://me:s3cret@index.invalid/simple", proxy=proxy))
    assert got.read_bytes() == data


def test_index_listing_another_hash_is_refused(tmp_path, package):
    data, digest = package
    page = {"files": [{"filename": NAME, "url": "/f", "hashes": {"sha256": "0" * 64}}]}
    routes = {"/simple/demo/": ("application/vnd.pypi.simple.v1+json", json.dumps(page).encode())}
    with serve(routes) as url, pytest.raises(AutodiceError, match="not the pinned"):
        sdist.fetch("demo", NAME, digest, tmp_path, QUIET, config(index_url=url + "/simple"))


def test_tampered_download_is_refused_and_nothing_kept(tmp_path, package):
    data, digest = package
    html = f'<a href="/f/{NAME}">x</a>'
    routes = {"/simple/demo/": ("text/html", html.encode()), f"/f/{NAME}": ("x/y", data[:-1])}
    with serve(routes) as url, pytest.raises(AutodiceError, match="does not match the pinned"):
        sdist.fetch("demo", NAME, digest, tmp_path, QUIET, config(index_url=url + "/simple"))
    assert list(tmp_path.iterdir()) == []


def test_no_network_names_what_was_tried_and_the_way_out(tmp_path, package):
    _, digest = package
    dead = f"http://127.0.0.1:{closed_port()}/simple"
    with serve({}) as empty, pytest.raises(AutodiceError) as e:
        sdist.fetch("demo", NAME, digest, tmp_path, QUIET,
                    config(index_url=dead, extra_index_urls=(empty + "/simple",),
                           find_links=(str(tmp_path / "nowhere"),)),
                    offline_hint="set AUTODICE_NCNN_SDIST")
    (message,) = e.value.problems
    assert dead in message and "refused" in message.lower()
    assert f"{empty}/simple (HTTP 404)" in message
    assert "nowhere (no demo-1.0.tar.gz)" in message
    assert message.endswith("set AUTODICE_NCNN_SDIST")


def test_a_cached_file_with_the_right_hash_is_not_fetched_again(tmp_path, package):
    data, digest = package
    (tmp_path / NAME).write_bytes(data)
    got = sdist.fetch("demo", NAME, digest, tmp_path, QUIET, config())  # index unreachable
    assert got == tmp_path / NAME


def test_local_source_package_is_hash_checked(tmp_path, package):
    data, digest = package
    given = tmp_path / "elsewhere.tar.gz"
    given.write_bytes(data)
    got = sdist.use_local(given, NAME, digest, tmp_path / "cache", "AUTODICE_NCNN_SDIST")
    assert got.name == NAME and got.read_bytes() == data
    with pytest.raises(AutodiceError, match=r"AUTODICE_NCNN_SDIST=.*does not match"):
        sdist.use_local(given, NAME, "0" * 64, tmp_path / "cache", "AUTODICE_NCNN_SDIST")


def test_engine_refuses_a_wrong_ncnn_sdist(tmp_path, monkeypatch):
    bogus = tmp_path / "ncnn.tar.gz"
    bogus.write_bytes(b"not ncnn")
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTODICE_NCNN_SDIST", str(bogus))
    with pytest.raises(AutodiceError, match="AUTODICE_NCNN_SDIST=.*does not match the pinned"):
        engine.sdist(QUIET)


def test_the_pinned_ncnn_sdist_comes_from_the_configured_index_into_an_empty_cache(
        tmp_path, monkeypatch):
    """The real index, as pip on this machine is configured: no warm cache can hide a break."""
    monkeypatch.delenv("AUTODICE_NCNN_SDIST", raising=False)
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path))
    got = engine.sdist(QUIET)
    assert got == tmp_path / "ncnn" / "downloads" / engine.SDIST_NAME
    assert sdist.sha256_of(got) == engine.NCNN_SDIST_SHA256


# --- pip's configuration ----------------------------------------------------------------------


def test_pip_config_files_then_environment_in_pips_order(tmp_path, monkeypatch):
    monkeypatch.setattr(sdist, "SYSTEM_CONF", tmp_path / "etc-pip.conf")  # not this machine's
    (tmp_path / "xdg" / "pip").mkdir(parents=True)
    (tmp_path / "xdg" / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = http://global/simple\ntimeout = 7\nfind-links = /a /b\n")
    (tmp_path / "home" / ".config" / "pip").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nextra-index-url =\n    http://user1/simple\n    http://user2/simple\n"
        "[install]\ncert = /etc/user.pem\n")
    env = {"XDG_CONFIG_DIRS": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home"),
           "PIP_TRUSTED_HOST": "user1", "PIP_DEFAULT_TIMEOUT": "9"}
    c = sdist.pip_config(env)
    assert c.index_url == "http://global/simple"
    assert c.extra_index_urls == ("http://user1/simple", "http://user2/simple")
    assert c.find_links == ("/a", "/b") and c.cert == "/etc/user.pem"
    assert c.timeout == 9.0 and c.trusted_hosts == ("user1",)
    assert c.locations() == ["/a", "/b", "http://global/simple", "http://user1/simple",
                             "http://user2/simple"]
    # PIP_CONFIG_FILE overrides the files before it and hides the user's files.
    explicit = tmp_path / "explicit.conf"
    explicit.write_text("[download]\nindex-url = http://explicit/simple\nno-index = yes\n")
    c = sdist.pip_config({**env, "PIP_CONFIG_FILE": str(explicit)})
    assert c.index_url == "http://explicit/simple" and c.no_index and c.extra_index_urls == ()
    assert sdist.pip_config({**env, "PIP_CONFIG_FILE": os.devnull}).index_url == \
        sdist.PYPI_SIMPLE


def test_unreadable_pip_config_is_one_error(tmp_path):
    bad = tmp_path / "pip.conf"
    bad.write_text("no section header\n")
    with pytest.raises(AutodiceError, match="pip.conf: pip configuration cannot be read"):
        sdist.pip_config({"PIP_CONFIG_FILE": str(bad), "HOME": str(tmp_path)})


# --- the build and its cache ------------------------------------------------------------------


def test_ncnn_dir_without_config_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODICE_NCNN_DIR", str(tmp_path))
    with pytest.raises(AutodiceError, match="AUTODICE_NCNN_DIR=.*ncnnConfig.cmake"):
        engine.ensure_ncnn()


def test_ncnn_dir_with_config_is_used_as_is(tmp_path, monkeypatch):
    (tmp_path / engine.CONFIG).parent.mkdir(parents=True)
    (tmp_path / engine.CONFIG).touch()
    monkeypatch.setenv("AUTODICE_NCNN_DIR", str(tmp_path))
    assert engine.ensure_ncnn() == tmp_path.resolve()


def test_cache_hit_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODICE_NCNN_DIR", raising=False)
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path))
    key = engine.cache_key(engine.ncnn_flags(vulkan=True))
    config_file = tmp_path / "ncnn" / key / "install" / engine.CONFIG
    config_file.parent.mkdir(parents=True)
    config_file.touch()
    monkeypatch.setattr(engine, "_build", lambda *a: pytest.fail("must not build"))
    assert engine.ensure_ncnn() == tmp_path / "ncnn" / key / "install"


X86_AVX2 = "fpu sse sse2 avx avx2 fma f16c"


@pytest.mark.parametrize("features, level", [
    ("fpu sse sse2", {"NCNN_AVX": "OFF", "NCNN_AVX2": "OFF"}),
    ("sse2 avx", {"NCNN_AVX": "ON", "NCNN_FMA": "OFF", "NCNN_AVX2": "OFF"}),
    (X86_AVX2, {"NCNN_AVX2": "ON", "NCNN_AVX512": "OFF"}),
    (X86_AVX2 + " avx512f avx512cd avx512bw avx512dq avx512vl", {"NCNN_AVX512": "ON"}),
])
def test_x86_builds_one_code_path_for_the_cpu(features, level):
    flags = engine.ncnn_flags(machine="x86_64", features=features.split())
    assert flags["NCNN_RUNTIME_CPU"] == "OFF"
    assert flags["NCNN_XOP"] == "OFF" and flags["NCNN_FMA4"] == "OFF"  # Illegal instruction
    assert {k: flags[k] for k in level} == level


def test_other_architectures_keep_ncnns_runtime_dispatch():
    flags = engine.ncnn_flags(machine="aarch64", features="fp asimd asimdhp".split())
    assert "NCNN_RUNTIME_CPU" not in flags and "NCNN_AVX2" not in flags


def test_cpu_features_from_cpuinfo():
    assert engine.cpu_features("processor\t: 0\nflags\t\t: fpu avx2\nflags : x\n") == \
        {"fpu", "avx2"}
    assert engine.cpu_features("Features\t: fp asimd\n") == {"fp", "asimd"}


def test_each_cpu_and_the_gpu_build_get_their_own_cache_entry():
    keys = {engine.cache_key(engine.ncnn_flags(v, "x86_64", f.split()))
            for v in (False, True) for f in ("sse2", X86_AVX2)}
    assert len(keys) == 4 and all(k.startswith(engine.NCNN_PIN + "-") for k in keys)
    assert engine.profile_name(engine.ncnn_flags(True)) == "vulkan"


def test_cmake_args_pin_mpi_and_ncnn(tmp_path):
    args = engine.cmake_args(tmp_path)
    assert f"-Dncnn_DIR={tmp_path / 'lib/cmake/ncnn'}" in args
    mpi_home = next(a for a in args if a.startswith("-DMPI_HOME="))
    assert (Path(mpi_home.split("=", 1)[1]) / "bin" / "mpicxx").exists()


def _fake_sdist(folder: Path, cmakelists: str) -> Path:
    """A tiny source package shaped like ncnn's: one top folder with a CMakeLists.txt."""
    top = folder / "fake-1"
    top.mkdir(parents=True)
    (top / "ncnnConfig.cmake").write_text("set(ncnn_FOUND TRUE)\n")
    (top / "CMakeLists.txt").write_text(cmakelists)
    source = folder / "fake-1.tar.gz"
    with tarfile.open(source, "w:gz") as tar:
        tar.add(top, arcname="fake-1")
    return source


FAKE_OK = """cmake_minimum_required(VERSION 3.16)
project(fake NONE)
install(FILES ncnnConfig.cmake DESTINATION lib/cmake/ncnn)
"""


@pytest.mark.cpp
def test_build_installs_into_the_cache_atomically(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODICE_NCNN_DIR", raising=False)
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path / "cache"))
    source = _fake_sdist(tmp_path, FAKE_OK)
    monkeypatch.setattr(engine, "sdist", lambda console: source)
    prefix = engine.ensure_ncnn(console=QUIET)
    entry = prefix.parent
    assert (prefix / engine.CONFIG).is_file()
    assert entry.name == engine.cache_key(engine.ncnn_flags(vulkan=True))
    assert sorted(p.name for p in entry.iterdir()) == ["build.log", "install"]
    assert not list(entry.parent.glob(".tmp-*"))  # no leftovers beside the entry


@pytest.mark.cpp
def test_failed_build_leaves_no_entry_and_shows_the_log(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODICE_NCNN_DIR", raising=False)
    monkeypatch.setenv("AUTODICE_CACHE", str(tmp_path / "cache"))
    source = _fake_sdist(tmp_path, 'project(fake NONE)\nmessage(FATAL_ERROR "boom in fake")\n')
    monkeypatch.setattr(engine, "sdist", lambda console: source)
    with pytest.raises(AutodiceError, match=r"(?s)failed while configuring.*boom in fake"):
        engine.ensure_ncnn(console=QUIET)
    root = tmp_path / "cache" / "ncnn"
    key = engine.cache_key(engine.ncnn_flags(vulkan=True))
    assert not (root / key).exists() and not list(root.glob(".tmp-*"))
    assert "boom in fake" in (root / f"{key}.failed.log").read_text()


@pytest.mark.cpp
def test_a_build_interrupted_half_way_is_not_trusted_and_the_next_run_builds(tmp_path):
    """Ctrl-C while cmake runs: no cache entry appears, and the next run builds a good one."""
    slow = _fake_sdist(tmp_path / "slow", FAKE_OK.replace(
        "project(fake NONE)", 'project(fake NONE)\nexecute_process(COMMAND sleep 60)'))
    good = _fake_sdist(tmp_path / "good", FAKE_OK)
    env = {**os.environ, "AUTODICE_CACHE": str(tmp_path / "cache")}
    env.pop("AUTODICE_NCNN_DIR", None)
    script = ("import sys; from pathlib import Path; from autodice.backend import engine; "
              "engine.sdist = lambda console: Path(sys.argv[1]); print(engine.ensure_ncnn())")
    # As from a terminal: a job started in the background by a shell inherits SIGINT ignored.
    proc = subprocess.Popen([sys.executable, "-c", script, str(slow)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    root = tmp_path / "cache" / "ncnn"
    deadline = time.monotonic() + 60
    while not list(root.glob(".tmp-*/build")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    key = engine.cache_key(engine.ncnn_flags(vulkan=True))
    assert not (root / key).exists()
    done = subprocess.run([sys.executable, "-c", script, str(good)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == root / key / "install"
    assert not list(root.glob(".tmp-*"))  # the dead build's leftovers were swept
