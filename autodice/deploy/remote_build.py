"""Step 3 of deploy, ``build``: the program, and ncnn where a host has none, built on the hosts.

Boards of another architecture than this machine's get their program cross-built here
(:mod:`.head_build`) and receive the binary. Among the others, hosts that share an
architecture (``uname -m``), a filesystem label and the MPI and ncnn prefixes form one build
group: the first of them builds, the others receive its binary by rsync. A build
runs only when the sources or flags differ from the stamp the last successful one left there, a
copy only when the binaries differ. Within a deploy the build overlaps the sync step: a builder
starts as soon as its own package is there. A host with no ncnn builds the pinned ncnn once in
its remote directory, with the instruction sets that every host of its group has. A builder
keeps the runtime library it compiled in its own cache and links it from then on (as
:mod:`autodice.backend.build` does here): the first deploy of another plan compiles only
program.cpp.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

from ..backend.build import RUNTIME_FILES, files_digest
from ..backend.engine import werror_flags
from ..core.errors import AutodiceError
from .head_build import HERE, HeadBuilds
from .ssh import PROGRAM, Build, Host, Progress, Ssh, must, parallel

# A build that outlives the deploy's ssh (Ctrl-C, a timeout: sshd leaves a command without a
# terminal running, and a shared master keeps the connection) would build on beside the next
# deploy's, into the same folder. So the deploy holds a pipe on the command's stdin until the
# command ends (``_run_held``): the build runs in the background, and a watcher reading that
# stdin ends it and all it started at EOF, which comes only if the ssh went. It stops every
# process of the tree, reads the tree again and stops any new one (a make can fork between a
# reading and its stop), until none is new, then kills them all, deaf to the TERM that the
# shell's wait sends it once the job, killed first, has ended: that TERM cut the KILL short, and
# the rest of the tree stayed stopped (full test runs found it there 15 s later). The watcher
# is the shell itself, no child of its own holds the session's pipes: ssh returns as soon as the
# build is done. ``tree`` reads /proc once and starts no process (reading each entry's parent
# with sed and cut, per process of the tree, took 772 ms for 6 processes among 72 entries on an
# idle machine; 11 ms this way).
_GUARDED = r"""
ppid_of() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d ' ' -f 2; }
tree() {  # $1 and its descendants, from one pass over /proc that starts no process
  root=$1 pairs=
  for p in /proc/[0-9]*; do
    read -r s 2>/dev/null < "$p/stat" || continue
    s=${s##*) }; set -- $s; pairs="$pairs ${p#/proc/}:$2"
  done
  found=" $root " more=1
  while [ -n "$more" ]; do
    more=
    for pair in $pairs; do
      case "$found" in *" ${pair%%:*} "*) continue ;; esac
      case "$found" in *" ${pair#*:} "*) found="$found${pair%%:*} " more=1 ;; esac
    done
  done
  echo $found
}
guard() {
  exec 3<&0
  "$@" < /dev/null & job=$!
  ( while read -r _; do :; done
    [ "$(ppid_of "$job")" = "$$" ] || exit 0  # ended already (and reaped: not ours)
    trap '' TERM  # the job dies first, and the wait below then TERMs us: finish the KILL first
    t=$(tree "$job")
    while kill -STOP $t; n=$(tree "$job"); [ "$n" != "$t" ]; do t=$n; done
    kill -KILL $t ) <&3 > /dev/null 2>&1 &
  watcher=$!
  exec 3<&-
  wait "$job"; code=$?
  kill "$watcher" 2>/dev/null
  return $code
}
"""
# Configure (unless done with these flags) and build; $3 names the sources and flags, and is
# written with the binary's checksum only once the build succeeded; $4 is the executable. The
# log stays on the host (its tail comes back). A build folder configured with other flags
# (another MPI or ncnn) starts afresh; one reused that then fails to build (left half-written by
# an interrupted build) is built once more from nothing before the failure counts.
# $5 (empty for a package without one) hashes the runtime library's sources: with the flags,
# the compiler, the machine and ncnn's platform.h it keys where the host keeps the library
# (~/.cache/autodice/runtime), built by the first build that lacks it, linked by every later one.
_BUILD = _GUARDED + r"""
build() {
cd "$1" || exit 1
jobs=$2; stamp=$3; exe=$4; runtime=$5; shift 5
lib=; platform=
if [ -n "$runtime" ]; then
  for f in "$@"; do
    case $f in -Dncnn_DIR=*) platform="${f#-Dncnn_DIR=}/../../../include/ncnn/platform.h";; esac
  done
  id=$({ printf '%s\n' "$*" "$CXXFLAGS"; ${CXX:-c++} --version 2>&1 | head -n 1; uname -m
         cat "$platform" 2>/dev/null; } | cksum | cut -d ' ' -f 1)
  lib="${XDG_CACHE_HOME:-$HOME/.cache}/autodice/runtime/$runtime-$id/libautodice_runtime.a"
  set -- "$@" "-DAUTODICE_RUNTIME_LIB=$lib"
fi
flags="$*"
configure() {
  rm -rf build && mkdir -p build && cmake -S package -B build "$@" > build.log 2>&1 \
    && printf '%s' "$flags" > build/autodice-flags
}
if [ -f build/CMakeCache.txt ] && [ "$(cat build/autodice-flags 2>/dev/null)" = "$flags" ]; then
  rm -f build/autodice-built
  : > build.log  # configured with these flags before: make re-runs cmake if a CMakeLists changed
  cmake --build build -j "$jobs" >> build.log 2>&1 \
    || { configure "$@" && cmake --build build -j "$jobs" >> build.log 2>&1; } || exit 1
else
  configure "$@" && cmake --build build -j "$jobs" >> build.log 2>&1 || exit 1
fi
if [ -n "$lib" ] && [ ! -f "$lib" ] && [ -f build/libautodice_runtime.a ]; then
  mkdir -p "${lib%/*}" && cp build/libautodice_runtime.a "$lib.$$" && mv -f "$lib.$$" "$lib"
fi
p=$(cksum < "build/$exe")
printf '%s %s' "$stamp" "$p" > build/autodice-built
echo "program=$p"
}
guard build "$@"
"""
# Build the pinned ncnn from its source package once: $1 remote dir, $2 tarball, $3 cache key,
# $4 jobs, then cmake flags. The install appears by rename, so a half build is never used.
_BUILD_NCNN = _GUARDED + r"""
build() {
cd "$1/ncnn" || exit 1
sdist=$2; key=$3; jobs=$4; shift 4
[ -f "$key/install/lib/cmake/ncnn/ncnnConfig.cmake" ] && exit 0
rm -rf tmp && mkdir tmp && tar -xzf "$sdist" -C tmp || exit 1
src=$(dirname "$(ls tmp/*/CMakeLists.txt | head -n 1)")
{ cmake -S "$src" -B tmp/build "$@" && cmake --build tmp/build -j "$jobs" \
  && cmake --install tmp/build --prefix tmp/install; } > ncnn-build.log 2>&1 || exit 1
rm -rf "$key" && mkdir "$key" && mv tmp/install "$key/install" && rm -rf tmp
}
guard build "$@"
"""


def build_groups(hosts: list[Host]) -> dict[str, list[Host]]:
    """Builder host -> the hosts its binary serves (itself first).

    One build serves hosts with the same machine architecture *and* a shared filesystem label
    and the same MPI and ncnn prefixes: the binary links those by path. Everyone else builds.
    """
    groups: dict[tuple, list[Host]] = {}
    for h in hosts:
        t = h.target
        key = ((h.arch, t.filesystem, t.mpi_prefix, t.ncnn_dir) if t.filesystem
               else ("own", t.host))
        groups.setdefault(key, []).append(h)
    return {g[0].target.host: g for g in groups.values()}


def build_all(ssh: Ssh, hosts: list[Host], sources: str, bin_dir: Path,
              progress: Progress, build: Build = PROGRAM,
              gpu_hosts: frozenset[str] = frozenset(),
              sync: Callable[[Host], None] | None = None,
              package: Callable[[Host], Path] | None = None, runtime: str = "") -> None:
    """Build once per group where sources or flags changed; copy the binary where it differs.

    ``sources`` names what the package holds (a build whose stamp differs runs again); binaries
    that travel between hosts pass through ``bin_dir/BUILDER/``. A group with a host in
    ``gpu_hosts`` (it runs GPU ranks) gets an ncnn with Vulkan.

    Args:
        sync: the sync step for one host, overlapped with this one: every host syncs at once,
            and a builder starts building as soon as its own package is there (it needs no other
            host's), while the others still receive theirs. Problems of both steps, of every
            host, come in one error.
        package: the local folder a host's package comes from: hosts whose program is
            cross-built here (``h.cross``, see :mod:`.head_build`) are built from it, once per
            architecture, and receive the binary.
        runtime: the hash of the package's runtime library sources (``files_digest`` of
            ``RUNTIME_FILES``): every host keeps the library it built and links it from then
            on, so the next plan compiles only program.cpp. Empty: the package has none.
    """
    crossed = [h for h in hosts if h.cross]
    kinds = {h.toolchain.key: [m for m in crossed if m.toolchain.key == h.toolchain.key]
             for h in crossed}  # one build per toolchain (head_build.choose set them)
    heads = HeadBuilds(bin_dir.parent, sources, package or (lambda h: Path()),
                       lambda group: group_ncnn_flags(group, gpu_hosts), build, bool(runtime))
    groups = build_groups([h for h in hosts if not h.cross])
    builders = [g[0] for g in groups.values()]
    for b in builders:
        for h in groups[b.target.host]:
            h.builder = b.target.host
    ncnn = {b.target.host: group_ncnn_flags(groups[b.target.host], gpu_hosts)
            for b in builders}
    plans = {b.target.host: build_flags(b, ncnn[b.target.host]) for b in builders}
    stamps = {k: f"{sources}-{hashlib.sha256(' '.join(f).encode()).hexdigest()[:12]}"
              for k, f in plans.items()}
    fetched: dict[str, Path] = {}

    def prepare(h: Host) -> None:
        """Sync ``h``; if it builds for its group, build ncnn (if needed) and the program (if
        stale) there, and fetch the binary if another host of the group lacks it."""
        name = h.target.host
        if sync is not None:
            _step("sync", sync, h)
        if h.cross:
            kind = h.toolchain.key
            progress(name, f"cross-build ({kind}) here")
            _step(f"cross-build for {kind}", lambda b: _ship_cross(b, kinds[kind]), h)
            return
        if h.builder != name:
            return
        if not h.target.ncnn_dir:
            progress(name, "build ncnn")
            _step("build ncnn", lambda b: _build_ncnn(ssh, b, ncnn[name]), h)
        # The stamp names the binary it built: a host that received another builder's binary
        # since (another key order made another host the group's builder) builds again.
        if h.facts.get("built") != f"{stamps[name]} {h.program}" or not h.program:
            progress(name, "build")
            _step("build", lambda b: _build(ssh, b, plans[name], stamps[name], build,
                                            runtime), h)
        if any(m.program != h.program for m in groups[name]):
            progress(name, "fetch program")
            local = bin_dir / name / build.exe
            local.parent.mkdir(parents=True, exist_ok=True)
            _step("fetch program", lambda b: must(
                ["rsync", "-pc", "-e", ssh.rsh(), f"{name}:{build.binary(b)}", str(local)],
                "fetching the program failed"), h)
            fetched[name] = local

    def _ship_cross(h: Host, group: list[Host]) -> None:
        binary, checksum, compiled = heads.binary(h, group)
        h.builder, h.compiled = HERE, compiled
        if h.program != checksum:
            progress(h.target.host, f"receive {h.arch} program")
            folder = shlex.quote(build.binary(h).rpartition("/")[0])
            must(["rsync", "-pc", "-e", ssh.rsh(), f"--rsync-path=mkdir -p {folder} && rsync",
                  str(binary), f"{h.target.host}:{build.binary(h)}"],
                 "sending the program failed")
            h.program = checksum

    problems = parallel(hosts, "", prepare, progress, label="sync + build" if sync else "build")
    if problems:
        raise AutodiceError(*problems)
    by_name = {b.target.host: b for b in builders}

    def receive(h: Host) -> None:
        must(["rsync", "-pc", "-e", ssh.rsh(), str(fetched[h.builder]),
              f"{h.target.host}:{build.binary(h)}"], "sending the program failed")
        h.program = by_name[h.builder].program

    problems = parallel([h for h in hosts if not h.cross and h.builder != h.target.host
                         and h.program != by_name[h.builder].program], "receive program",
                        receive, progress)
    if problems:
        raise AutodiceError(*problems)


def _step(step: str, fn: Callable[[Host], object], h: Host) -> None:
    """``fn(h)``, its problem lines prefixed with ``step``."""
    try:
        fn(h)
    except AutodiceError as e:
        first, *rest = e.problems
        raise AutodiceError(f"{step}: {first}", *rest) from None


def package_digest(package: Path) -> str:
    """What the program is built from (the same in every package): changes force a build."""
    return files_digest(package, ("program.cpp", *RUNTIME_FILES))


def group_ncnn_flags(group: list[Host], gpu_hosts: frozenset[str]) -> dict[str, str]:
    """ncnn's switches for a build group: the instruction sets *every* host of it has, since
    one binary runs on all of them; Vulkan if one of them runs GPU ranks."""
    from ..backend.engine import ncnn_flags

    features = frozenset.intersection(*(h.features for h in group))
    vulkan = any(h.target.host in gpu_hosts for h in group)
    return ncnn_flags(vulkan, machine=group[0].arch, features=features)


def build_flags(b: Host, ncnn: dict[str, str]) -> list[str]:
    """cmake flags for a builder: its MPI, and its ncnn (given, or the one deploy builds)."""
    t = b.target
    flags = ["-DCMAKE_BUILD_TYPE=Release"]
    if t.mpi_prefix:
        flags += [f"-DMPI_HOME={t.mpi_prefix}",
                  f"-DMPIEXEC_EXECUTABLE={t.mpi_prefix}/bin/mpiexec"]
    return [*flags, f"-Dncnn_DIR={t.ncnn_dir or remote_ncnn(b, ncnn)}/lib/cmake/ncnn",
            *werror_flags()]


def ncnn_prefixes(hosts: list[Host], gpu_hosts: frozenset[str]) -> dict[str, str]:
    """Host -> the ncnn its builds use: the inventory's, or the one deploy built on its group's
    builder (a deploy into another folder of the same hosts reuses it)."""
    prefixes = {}
    for group in build_groups(hosts).values():
        flags = group_ncnn_flags(group, gpu_hosts)
        for h in group:
            prefixes[h.target.host] = h.target.ncnn_dir or remote_ncnn(group[0], flags)
    return prefixes


def remote_ncnn(h: Host, ncnn: dict[str, str]) -> str:
    """Where deploy builds ncnn on a host that has none (keyed like the local cache)."""
    from ..backend.engine import cache_key

    return f"{h.dir}/ncnn/{cache_key(ncnn)}/install"


def _run_held(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` (a ``_GUARDED`` script over ssh) with a pipe on its stdin that nothing writes and
    this process holds open until the command ends: EOF there means its ssh went."""
    r, w = os.pipe()
    try:
        return subprocess.run(cmd, stdin=r, capture_output=True, text=True, timeout=timeout)
    finally:
        os.close(r)
        os.close(w)


def _build(ssh: Ssh, h: Host, flags: list[str], stamp: str, build: Build = PROGRAM,
           runtime: str = "") -> None:
    t = h.target
    root = build.root(h)
    proc = _run_held(ssh.script(t, _BUILD, root, str(max(1, h.cpus)), stamp, build.exe,
                                runtime, *flags, held=True), timeout=1800)
    if proc.returncode != 0:
        tail = subprocess.run(ssh.cmd(t, "tail", "-n", "15", f"{root}/build.log"),
                              capture_output=True, text=True, timeout=60).stdout
        raise AutodiceError(f"compiling failed (log: {t.host}:{root}/build.log):",
                            *tail.rstrip().splitlines())
    h.program = next((ln.partition("=")[2] for ln in proc.stdout.splitlines()
                      if ln.startswith("program=")), "")
    h.compiled = True


def _build_ncnn(ssh: Ssh, h: Host, flags: dict[str, str]) -> None:
    """No ncnn on the host: send the pinned source package and build it there once."""
    from rich.console import Console

    from ..backend.engine import cache_key, sdist

    t = h.target
    key = cache_key(flags)
    if key in h.facts.get("ncnn_built", "").split():
        return
    source = sdist(Console(stderr=True, quiet=True))
    must(ssh.cmd(t, "mkdir", "-p", f"{h.dir}/ncnn"), "cannot create the remote directory")
    must(["rsync", "-pc", "-e", ssh.rsh(), str(source), f"{t.host}:{h.dir}/ncnn/{source.name}"],
         "sending the ncnn source failed")
    proc = _run_held(ssh.script(t, _BUILD_NCNN, h.dir, source.name, key, str(h.cpus),
                                *(f"-D{k}={v}" for k, v in sorted(flags.items())), held=True),
                     timeout=3600)
    if proc.returncode != 0:
        tail = subprocess.run(ssh.cmd(t, "tail", "-n", "15", f"{h.dir}/ncnn/ncnn-build.log"),
                              capture_output=True, text=True, timeout=60).stdout
        raise AutodiceError(f"building ncnn failed (log: {t.host}:{h.dir}/ncnn/ncnn-build.log):",
                            *tail.rstrip().splitlines())
