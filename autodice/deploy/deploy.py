"""``autodice deploy``: ship each host's package over ssh, build it there, run mpirun across hosts.

Steps, each over all hosts at once (one thread per host), each finished by every host before the
next starts, so a broken host stops the deploy before anything runs anywhere:

1. ``connect`` + ``check``: one ssh master connection per host (later steps reuse it: no new
   handshakes), opened by the check itself: architecture, cores, tools (compiler, cmake, rsync,
   MPI, ncnn) and what an earlier deploy left there. Every failing host is reported at once.
2. ``sync``: rsync the package into ``<remote_dir>/package`` by content (``-c``, no times), so
   only changed files move and unchanged sources keep their remote mtimes (make rebuilds nothing
   it need not). Bytes sent per host come from ``rsync --stats``.
3. ``build``: hosts that share an architecture (``uname -m``) and a filesystem label (and MPI and
   ncnn prefixes) build once, on the first of them; the others receive the binary by rsync. Hosts
   without a shared filesystem build their own. A build runs only when the sources or flags
   differ from the last one that succeeded there (a stamp it leaves), a copy only when the
   binaries differ. A host with no ncnn builds the pinned ncnn once in its remote directory.
4. ``run`` (``--run``): the real-address hostfile, rankfile and an ssh config go to the head node
   (the host of rank 0), which starts ``mpirun`` with Open MPI's ssh launcher; one MPMD app
   context per rank gives each its own host's directory. Outputs and ``stats.json`` come back
   into ``OUT/results/``. Whatever happens, no rank of ours is left running on any host.

Nothing here builds a shell string from spec values: local commands are argument lists; the one
remote shell per ssh call gets constant scripts whose values arrive as quoted positional
arguments, and every remote path is a fixed name inside the inventory's (validated) remote_dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backend.run import RunResult, stage_inputs
from ..core.errors import AutodiceError
from ..core.outdir import tensor_files
from ..core.plan import Plan, load_plan
from .inventory import Inventory, Target, load_inventory

Progress = Callable[[str, str], None]  # (host, what it is doing now)
REMOTE_FOLDERS = ("package", "build", "inputs", "results", "launch")  # all inside remote_dir

# Prerequisites, run on each host. Values arrive as "$1"...: never spliced into the script.
# $3 is the remote dir, $4 the folder of the program being deployed (see Build), $5 its name.
_CHECK = r"""
m=$1; n=$2; d=$3; b=$4; e=$5
echo "arch=$(uname -m)"
echo "cpus=$(nproc 2>/dev/null || echo 1)"
echo "cpus_all=$(nproc --all 2>/dev/null || echo 1)"
echo "cpu=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2-)"
for t in c++ cmake make rsync tar; do
  command -v "$t" >/dev/null 2>&1 || echo "missing=$t"
done
if [ -n "$m" ]; then
  for t in mpirun mpicxx; do [ -x "$m/bin/$t" ] || echo "missing=$t ($m/bin/$t)"; done
else
  for t in mpirun mpicxx; do
    command -v "$t" >/dev/null 2>&1 || echo "missing=$t (not on PATH; set mpi_prefix)"
  done
fi
if [ -n "$n" ] && [ ! -f "$n/lib/cmake/ncnn/ncnnConfig.cmake" ]; then
  echo "missing=ncnn ($n/lib/cmake/ncnn/ncnnConfig.cmake)"
fi
# What an earlier deploy left (read only): lets deploy skip a build or a copy that is done.
[ -f "$b/build/autodice-built" ] && echo "built=$(cat "$b/build/autodice-built")"
[ -x "$b/build/$e" ] && echo "program=$(cksum < "$b/build/$e")"
for f in "$d"/ncnn/*/install/lib/cmake/ncnn/ncnnConfig.cmake; do
  [ -f "$f" ] && k=${f#"$d/ncnn/"} && echo "ncnn_built=${k%%/*}"
done
exit 0
"""
# Configure (unless done with these flags) and build; $3 names the sources and flags, and is
# written only once the build succeeded; $4 is the executable. The log stays on the host (its
# tail comes back).
_BUILD = r"""
cd "$1" || exit 1
jobs=$2; stamp=$3; exe=$4; shift 4
flags="$*"
mkdir -p build
rm -f build/autodice-built
if [ -f build/CMakeCache.txt ] && [ "$(cat build/autodice-flags 2>/dev/null)" = "$flags" ]; then
  : > build.log  # configured with these flags before: make re-runs cmake if a CMakeLists changed
else
  cmake -S package -B build "$@" > build.log 2>&1 || exit 1
  printf '%s' "$flags" > build/autodice-flags
fi
cmake --build build -j "$jobs" >> build.log 2>&1 || exit 1
printf '%s' "$stamp" > build/autodice-built
echo "program=$(cksum < "build/$exe")"
"""
# Build the pinned ncnn from its source package once: $1 remote dir, $2 tarball, $3 cache key,
# $4 jobs, then cmake flags. The install appears by rename, so a half build is never used.
_BUILD_NCNN = r"""
cd "$1/ncnn" || exit 1
sdist=$2; key=$3; jobs=$4; shift 4
[ -f "$key/install/lib/cmake/ncnn/ncnnConfig.cmake" ] && exit 0
rm -rf tmp && mkdir tmp && tar -xzf "$sdist" -C tmp || exit 1
src=$(dirname "$(ls tmp/*/CMakeLists.txt | head -n 1)")
{ cmake -S "$src" -B tmp/build "$@" && cmake --build tmp/build -j "$jobs" \
  && cmake --install tmp/build --prefix tmp/install; } > ncnn-build.log 2>&1 || exit 1
rm -rf "$key" && mkdir "$key" && mv tmp/install "$key/install" && rm -rf tmp
"""
# Leave nothing of the job behind on a host: our ranks (their exe is our binary), the Open MPI
# daemons of our job (their namespace names mpirun's pid) and, on the head, the ssh sessions
# mpirun opened with our config. $1 program, $2 mpirun's pid or "", $3 that ssh config or "".
_REAP = r"""
prog=$1; job=$2; agent=$3
for sig in TERM KILL; do
  hit=
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    case "$(readlink "$p/exe" 2>/dev/null)" in
      "$prog"|"$prog (deleted)") kill -KILL "$pid" 2>/dev/null; continue ;;
    esac
    [ -n "$job$agent" ] || continue
    cmd=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null) || continue
    case "$cmd" in
      *prted*"ess_base_nspace prterun-"*"-$job@0 "*)
        [ -n "$job" ] && kill -"$sig" "$pid" && hit=1 ;;
      *"ssh -F $agent "*) [ -n "$agent" ] && kill -"$sig" "$pid" && hit=1 ;;
    esac
  done 2>/dev/null
  [ -n "$hit" ] || break
  sleep 1
done
exit 0
"""
# Start mpirun on the head with its output in a file (a daemon it leaves behind must not hold
# the ssh channel open), record its pid, wait, then print the output.
_LAUNCH = r"""
pidfile=$1; log=$2; shift 2
"$@" > "$log" 2>&1 < /dev/null &
echo $! > "$pidfile"
wait $!
code=$?
cat "$log"
exit $code
"""
# Each rank runs under this: a rank that dies of a signal (killed, out of memory, crashed)
# leaves "<time> <exit code>" in a marker file, so the report names the rank that died first
# rather than the peers that then lost their connection to it. $1 marker, then the command.
_RANK = r"""
marker=$1; shift
"$@"
code=$?
[ "$code" -gt 128 ] && echo "$(date +%s.%N) $code" > "$marker"
exit "$code"
"""
_STOP = r"""
pid=$(cat "$1" 2>/dev/null) || exit 0
grep -q "$2" "/proc/$pid/cmdline" 2>/dev/null && kill -TERM "$pid"
exit 0
"""


@dataclass(frozen=True)
class HostReport:
    """What deploy did on one host."""

    host: str
    arch: str  # uname -m
    cpus: int
    bytes_sent: int  # rsync's "Total bytes sent" for the package (data + protocol)
    literal_bytes: int  # file data that actually moved
    files: tuple[str, ...]  # package files that moved
    built: bool  # builds here; False: receives the binary built on ``built_by``
    built_by: str
    compiled: bool  # this deploy compiled (sources or flags changed, or no binary yet)


@dataclass(frozen=True)
class DeployResult:
    hosts: dict[str, HostReport]
    seconds: dict[str, float]  # per step, wall time
    run: RunResult | None = None


@dataclass
class _Host:
    """One host's live state during a deploy (mutable, private)."""

    target: Target
    arch: str = ""
    cpus: int = 1
    cpus_all: int = 1
    sent: tuple[int, int, tuple[str, ...]] = (0, 0, ())
    builder: str = ""
    features: frozenset[str] = frozenset()  # CPU flags: what a build for this host may use
    facts: dict = field(default_factory=dict)  # what the check script said
    program: str = ""  # checksum of the program this host has (builders: after the build)
    compiled: bool = False

    @property
    def dir(self) -> str:
        return self.target.remote_dir


@dataclass(frozen=True)
class Build:
    """A CMake program built on every host: sources in ``ROOT/package``, built in ``ROOT/build``
    into ``exe``; ROOT is the remote directory itself (deploy's program) or ``folder`` inside it
    (another program, e.g. the link profiler), so two programs never share a build or a stamp."""

    folder: str = ""
    exe: str = "program"

    def root(self, h: _Host) -> str:
        return f"{h.dir}/{self.folder}" if self.folder else h.dir

    def binary(self, h: _Host) -> str:
        return f"{self.root(h)}/build/{self.exe}"


PROGRAM = Build()  # what deploy builds: the generated program


class _Ssh:
    """ssh/rsync argument lists for one deploy: a config file plus shared master connections."""

    def __init__(self, inv: Inventory, work: Path):
        self.config = work / "ssh_config"
        self.config.write_text(ssh_config(inv.targets.values(), by="host"))
        # Socket paths must stay short (108 bytes), so not inside OUT.
        self.control = Path(tempfile.mkdtemp(prefix="adc-ssh-"))
        self.opts = ["-F", str(self.config), "-o", f"ControlPath={self.control}/%C"]

    def rsh(self) -> str:
        """rsync's ``-e``: a command line rsync splits itself, so quote each word."""
        return " ".join(shlex.quote(w) for w in ["ssh", *self.opts])

    def cmd(self, t: Target, *argv: str) -> list[str]:
        """``ssh host -- argv``; the remote shell sees each argument quoted."""
        return ["ssh", *self.opts, t.host, "--", " ".join(shlex.quote(a) for a in argv)]

    def script(self, t: Target, script: str, *args: str) -> list[str]:
        return self.cmd(t, "sh", "-c", script, "sh", *args)

    def open(self, t: Target, *argv: str) -> subprocess.CompletedProcess:
        """Start the master connection by running ``argv``; ssh exits 255 if it cannot connect.

        The master stays in the background (its stdio on /dev/null); later calls reuse it.
        """
        return subprocess.run(["ssh", *self.opts, "-o", "ControlMaster=yes",
                               "-o", "ControlPersist=900", t.host, "--",
                               " ".join(shlex.quote(a) for a in argv)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120)

    def close(self, targets) -> None:
        for t in targets:
            subprocess.run(["ssh", *self.opts, "-O", "exit", t.host], capture_output=True,
                           timeout=30)
        shutil.rmtree(self.control, ignore_errors=True)


def ssh_config(targets, by: str) -> str:
    """An ssh config naming each target ``by`` its host name (local) or its address (head).

    Host-key checking stays strict: a host whose key is not in known_hosts is refused.
    """
    blocks = []
    for t in targets:
        lines = [f"Host {t.host if by == 'host' else t.address}", f"  HostName {t.address}",
                 f"  Port {t.port}", f"  User {t.user}"]
        if t.identity:
            lines += [f"  IdentityFile {t.identity}", "  IdentitiesOnly yes"]
        if t.known_hosts:
            lines.append(f"  UserKnownHostsFile {t.known_hosts}")
        blocks.append("\n".join(lines))
    blocks.append("\n".join(["Host *", "  StrictHostKeyChecking yes", "  BatchMode yes",
                             "  ConnectTimeout 10", "  ServerAliveInterval 5",
                             "  ServerAliveCountMax 3", "  LogLevel ERROR"]))
    return "\n\n".join(blocks) + "\n"


def _why_ssh_failed(said: str) -> str:
    text = said.lower()
    if "permission denied" in text:
        kind = "authentication failed"
    elif "host key" in text:
        kind = "host key verification failed"
    elif any(s in text for s in ("refused", "no route", "timed out", "unreachable",
                                 "could not resolve", "closed by remote")):
        kind = "unreachable"
    else:
        kind = "ssh failed"
    lines = [ln for ln in said.splitlines() if ln.strip()]
    return f"{kind} ({lines[-1].strip() if lines else 'no message'})"


def _parallel(hosts: list[_Host], step: str, fn, progress: Progress,
              label: str | None = None) -> list[str]:
    """Run ``fn(host)`` for every host at once; returns one problem line per failed host.

    Each line is ``host (user@address:port): step: what went wrong``; with an empty ``step``
    the error names its own step.
    """
    problems: dict[str, str] = {}

    def one(h: _Host) -> None:
        progress(h.target.host, label or step)
        try:
            fn(h)
        except AutodiceError as e:
            problems[h.target.host] = "\n".join(e.problems)
        except subprocess.TimeoutExpired as e:
            problems[h.target.host] = f"timed out after {e.timeout:.0f} s"
        else:
            return
        progress(h.target.host, f"{label or step} failed")

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(one, hosts))
    return [f"{h.target.where()}: {step + ': ' if step else ''}{problems[h.target.host]}"
            for h in hosts if h.target.host in problems]


def _rsync_stats(out: str) -> tuple[int, int, tuple[str, ...]]:
    def number(label: str) -> int:
        m = re.search(rf"^{label}: ([\d,.]+)", out, re.MULTILINE)
        return int(m.group(1).replace(",", "").replace(".", "")) if m else 0

    listing = out.split("\nNumber of files:")[0] if "Number of files:" in out else ""
    files = tuple(ln for ln in listing.splitlines() if ln and not ln.endswith("/"))
    return number("Total bytes sent"), number("Literal data"), files


def deploy(out_dir: str | Path, inventory: str | Path, run: bool = False,
           inputs: dict[str, Path] | None = None, frames: int = 1, pipeline: bool = True,
           timeout_s: float = 600, progress: Progress | None = None,
           ) -> DeployResult:
    """Deploy ``out_dir``'s packages to the inventory's hosts; with ``run``, run the job there.

    Args:
        inventory: inventory.toml (see :mod:`autodice.inventory`).
        inputs: model input name -> .npy, needed with ``run``.
        timeout_s: the longest the job may run before it is stopped.
        progress: called with (host, step) as each host moves on.
    Returns:
        Per host what moved and where it was built; with ``run``, outputs and stats.
    Raises:
        AutodiceError: a bad inventory or input (before any network use), unreachable hosts,
            failed authentication or missing tools (all hosts at once, before anything is
            copied), a failed remote build (its log tail) or a failed run (rank and host named).
    """
    out_dir = Path(out_dir)
    progress = progress or (lambda host, step: None)
    plan = load_plan(out_dir)
    hosts_of_plan = plan.hosts()
    problems = []
    missing = [h for h in hosts_of_plan if not (out_dir / "packages" / h / "program.cpp").exists()]
    if missing:
        problems.append(f"{out_dir}/packages: no package for {', '.join(missing)}; "
                        f"run `autodice gen {out_dir}` first")
    try:
        inv = load_inventory(inventory, hosts_of_plan)
    except AutodiceError as e:
        problems += e.problems
    if problems:
        raise AutodiceError(*problems)
    if run:
        _check_launchable(inv)
    work = out_dir / "deploy"
    work.mkdir(exist_ok=True)
    if run:
        if inputs is None:
            raise AutodiceError("deploy --run needs --input")
        stage_inputs(plan, inputs, work / "inputs")
    hosts = [_Host(inv.targets[name]) for name in hosts_of_plan]
    ssh = _Ssh(inv, work)
    seconds: dict[str, float] = {}
    result_run = None
    try:
        _timed(seconds, "check", lambda: _check_all(ssh, hosts, progress))  # + connect
        _timed(seconds, "sync", lambda: _sync_all(ssh, hosts, lambda h: out_dir / "packages" / h,
                                                  progress))
        sources = source_digest(out_dir / "packages" / hosts[0].target.host)
        gpu_hosts = frozenset(r.host for r in plan.ranks if r.device == "gpu")
        _timed(seconds, "build", lambda: _build_all(ssh, hosts, sources, work / "bin", progress,
                                                    gpu_hosts=gpu_hosts))
        _write_launch_files(ssh, plan, inv, hosts, work, progress)
        if run:
            result_run = _timed(seconds, "run", lambda: _run_job(
                ssh, plan, inv, hosts, out_dir, frames, pipeline, timeout_s, progress))
    finally:
        ssh.close(inv.targets.values())
    for h in hosts:
        progress(h.target.host, "done")
    reports = {h.target.host: HostReport(h.target.host, h.arch, h.cpus, *h.sent,
                                         built=h.builder == h.target.host, built_by=h.builder,
                                         compiled=h.compiled)
               for h in hosts}
    (work / "report.json").write_text(json.dumps(
        {"hosts": {k: {**vars(r), "files": list(r.files)} for k, r in reports.items()},
         "seconds": seconds}, indent=1, sort_keys=True) + "\n")
    return DeployResult(reports, seconds, result_run)


def _timed(seconds: dict, step: str, fn):
    start = time.monotonic()
    try:
        return fn()
    finally:
        seconds[step] = round(time.monotonic() - start, 3)


def _check_launchable(inv: Inventory) -> None:
    """What mpirun needs of the inventory as a whole (before any network use)."""
    problems = []
    prefixes = {t.mpi_prefix for t in inv.targets.values()}
    if len(prefixes) > 1:
        problems.append(f"{inv.path}: hosts name different mpi_prefix values "
                        f"({', '.join(sorted(str(p) for p in prefixes))}); mpirun starts its "
                        "daemons from one prefix on every host")
    if problems:
        raise AutodiceError(*problems)


# --- steps ------------------------------------------------------------------------------------


def _check_all(ssh: _Ssh, hosts: list[_Host], progress: Progress, build: Build = PROGRAM) -> None:
    """Connect to every host and check its tools; all failing hosts in one error.

    Also reads what an earlier build of ``build`` left there (stamp, checksum of its binary).
    """
    def check(h: _Host) -> None:
        t = h.target
        proc = ssh.open(t, "sh", "-c", _CHECK, "sh", t.mpi_prefix or "", t.ncnn_dir or "", h.dir,
                        build.root(h), build.exe)
        if proc.returncode == 255:
            raise AutodiceError("connect: " + _why_ssh_failed(proc.stderr))
        if proc.returncode != 0:
            raise AutodiceError(f"check: the check script failed: {proc.stderr.strip()[-300:]}")
        missing = []
        for line in proc.stdout.splitlines():
            k, _, v = line.partition("=")
            if k == "missing":
                missing.append(v)
            elif k == "ncnn_built":
                h.facts[k] = f"{h.facts.get(k, '')} {v}".strip()
            else:
                h.facts.setdefault(k, v)
        h.arch = h.facts.get("arch", "?")
        h.cpus = int(h.facts.get("cpus") or 1)
        h.cpus_all = int(h.facts.get("cpus_all") or 1)
        h.features = frozenset(h.facts.get("cpu", "").split())
        h.program = h.facts.get("program", "")
        if missing:
            raise AutodiceError("check: missing " + ", ".join(missing))

    problems = _parallel(hosts, "", check, progress, label="connect + check")
    if problems:
        raise AutodiceError(*problems)


def _sync_all(ssh: _Ssh, hosts: list[_Host], local: Callable[[str], Path], progress: Progress,
              build: Build = PROGRAM, folders: tuple[str, ...] = REMOTE_FOLDERS) -> None:
    """rsync each host's package (``local(host)``) into ``build``'s package folder there, after
    making ``folders`` inside ``build``'s root."""
    def sync(h: _Host) -> None:
        t = h.target
        root = build.root(h)
        # rsync starts its remote end through the remote shell: make the folders first.
        made = " ".join(shlex.quote(f"{root}/{d}") for d in folders)
        proc = _must(["rsync", "-rpc", "--delete", "--exclude=/build/", "--stats",
                      "--out-format=%n", "-e", ssh.rsh(),
                      f"--rsync-path=mkdir -p {made} && rsync",
                      f"{local(t.host)}/", f"{t.host}:{root}/package/"],
                     "rsync failed")
        h.sent = _rsync_stats(proc.stdout)

    problems = _parallel(hosts, "sync", sync, progress)
    if problems:
        raise AutodiceError(*problems)


def _must(cmd: list[str], what: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise AutodiceError(f"{what}: {said[-1] if said else f'exit {proc.returncode}'}")
    return proc


def build_groups(hosts: list[_Host]) -> dict[str, list[_Host]]:
    """Builder host -> the hosts its binary serves (itself first).

    One build serves hosts with the same machine architecture *and* a shared filesystem label
    and the same MPI and ncnn prefixes: the binary links those by path. Everyone else builds.
    """
    groups: dict[tuple, list[_Host]] = {}
    for h in hosts:
        t = h.target
        key = ((h.arch, t.filesystem, t.mpi_prefix, t.ncnn_dir) if t.filesystem
               else ("own", t.host))
        groups.setdefault(key, []).append(h)
    return {g[0].target.host: g for g in groups.values()}


def _build_all(ssh: _Ssh, hosts: list[_Host], sources: str, bin_dir: Path,
               progress: Progress, build: Build = PROGRAM,
               gpu_hosts: frozenset[str] = frozenset()) -> None:
    """Build once per group where sources or flags changed; copy the binary where it differs.

    ``sources`` names what the package holds (a build whose stamp differs runs again); binaries
    that travel between hosts pass through ``bin_dir/BUILDER/``. A group with a host in
    ``gpu_hosts`` (it runs GPU ranks) gets an ncnn with Vulkan.
    """
    groups = build_groups(hosts)
    builders = [g[0] for g in groups.values()]
    for b in builders:
        for h in groups[b.target.host]:
            h.builder = b.target.host
    ncnn = {b.target.host: group_ncnn_flags(groups[b.target.host], gpu_hosts)
            for b in builders}
    problems = _parallel([b for b in builders if not b.target.ncnn_dir], "build ncnn",
                         lambda b: _build_ncnn(ssh, b, ncnn[b.target.host]), progress)
    if problems:
        raise AutodiceError(*problems)
    plans = {b.target.host: build_flags(b, ncnn[b.target.host]) for b in builders}
    stamps = {k: f"{sources}-{hashlib.sha256(' '.join(f).encode()).hexdigest()[:12]}"
              for k, f in plans.items()}
    stale = [b for b in builders
             if b.facts.get("built") != stamps[b.target.host] or not b.program]
    problems = _parallel(stale, "build", lambda b: _build(ssh, b, plans[b.target.host],
                                                          stamps[b.target.host], build), progress)
    if problems:
        raise AutodiceError(*problems)
    by_name = {b.target.host: b for b in builders}
    needy = [h for h in hosts if h.builder != h.target.host
             and h.program != by_name[h.builder].program]
    fetched: dict[str, Path] = {}

    def fetch(b: _Host) -> None:
        local = bin_dir / b.target.host / build.exe
        local.parent.mkdir(parents=True, exist_ok=True)
        _must(["rsync", "-pc", "-e", ssh.rsh(), f"{b.target.host}:{build.binary(b)}",
               str(local)], "fetching the program failed")
        fetched[b.target.host] = local

    problems = _parallel([by_name[k] for k in dict.fromkeys(h.builder for h in needy)],
                         "fetch program", fetch, progress)

    def receive(h: _Host) -> None:
        _must(["rsync", "-pc", "-e", ssh.rsh(), str(fetched[h.builder]),
               f"{h.target.host}:{build.binary(h)}"], "sending the program failed")
        h.program = by_name[h.builder].program

    problems += _parallel([h for h in needy if h.builder in fetched], "receive program",
                          receive, progress)
    if problems:
        raise AutodiceError(*problems)


def source_digest(package: Path) -> str:
    """What the program is built from (the same in every package): changes force a build."""
    digest = hashlib.sha256()
    for f in ("CMakeLists.txt", "program.cpp", "runtime/autodice_runtime.h",
              "runtime/autodice_runtime.cpp"):
        digest.update(f.encode() + b"\0" + (package / f).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def group_ncnn_flags(group: list[_Host], gpu_hosts: frozenset[str]) -> dict[str, str]:
    """ncnn's switches for a build group: the instruction sets *every* host of it has, since
    one binary runs on all of them; Vulkan if one of them runs GPU ranks."""
    from ..backend.engine import ncnn_flags

    features = frozenset.intersection(*(h.features for h in group))
    vulkan = any(h.target.host in gpu_hosts for h in group)
    return ncnn_flags(vulkan, machine=group[0].arch, features=features)


def build_flags(b: _Host, ncnn: dict[str, str]) -> list[str]:
    """cmake flags for a builder: its MPI, and its ncnn (given, or the one deploy builds)."""
    t = b.target
    flags = ["-DCMAKE_BUILD_TYPE=Release"]
    if t.mpi_prefix:
        flags += [f"-DMPI_HOME={t.mpi_prefix}",
                  f"-DMPIEXEC_EXECUTABLE={t.mpi_prefix}/bin/mpiexec"]
    return [*flags, f"-Dncnn_DIR={t.ncnn_dir or remote_ncnn(b, ncnn)}/lib/cmake/ncnn"]


def remote_ncnn(h: _Host, ncnn: dict[str, str]) -> str:
    """Where deploy builds ncnn on a host that has none (keyed like the local cache)."""
    from ..backend.engine import cache_key

    return f"{h.dir}/ncnn/{cache_key(ncnn)}/install"


def _build(ssh: _Ssh, h: _Host, flags: list[str], stamp: str, build: Build = PROGRAM) -> None:
    t = h.target
    root = build.root(h)
    proc = subprocess.run(ssh.script(t, _BUILD, root, str(max(1, h.cpus)), stamp, build.exe,
                                     *flags),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        tail = subprocess.run(ssh.cmd(t, "tail", "-n", "15", f"{root}/build.log"),
                              capture_output=True, text=True, timeout=60).stdout
        raise AutodiceError(f"compiling failed (log: {t.host}:{root}/build.log):",
                            *tail.rstrip().splitlines())
    h.program = next((ln.partition("=")[2] for ln in proc.stdout.splitlines()
                      if ln.startswith("program=")), "")
    h.compiled = True


def _build_ncnn(ssh: _Ssh, h: _Host, flags: dict[str, str]) -> None:
    """No ncnn on the host: send the pinned source package and build it there once."""
    from rich.console import Console

    from ..backend.engine import cache_key, sdist

    t = h.target
    key = cache_key(flags)
    if key in h.facts.get("ncnn_built", "").split():
        return
    source = sdist(Console(stderr=True, quiet=True))
    _must(ssh.cmd(t, "mkdir", "-p", f"{h.dir}/ncnn"), "cannot create the remote directory")
    _must(["rsync", "-pc", "-e", ssh.rsh(), str(source), f"{t.host}:{h.dir}/ncnn/{source.name}"],
          "sending the ncnn source failed")
    proc = subprocess.run(ssh.script(t, _BUILD_NCNN, h.dir, source.name, key, str(h.cpus),
                                     *(f"-D{k}={v}" for k, v in sorted(flags.items()))),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        tail = subprocess.run(ssh.cmd(t, "tail", "-n", "15", f"{h.dir}/ncnn/ncnn-build.log"),
                              capture_output=True, text=True, timeout=60).stdout
        raise AutodiceError(f"building ncnn failed (log: {t.host}:{h.dir}/ncnn/ncnn-build.log):",
                            *tail.rstrip().splitlines())


# --- run --------------------------------------------------------------------------------------


def honours_cores(plan: Plan, hosts: dict[str, _Host]) -> bool:
    """Whether every rank's cores exist on its host and no two ranks of a host share one.

    A host whose processes are confined to a CPU subset (``nproc`` < ``nproc --all``, e.g. an
    emulated host under taskset) cannot honour core numbers either.
    """
    used: dict[str, set[int]] = {}
    for r in plan.ranks:
        h = hosts[r.host]
        mine = used.setdefault(r.host, set())
        if h.cpus != h.cpus_all or any(c >= h.cpus or c in mine for c in r.slots):
            return False
        mine.update(r.slots)
    return True


def launch_files(plan: Plan, inv: Inventory) -> dict[str, str]:
    """hostfile and rankfile with real addresses, and the ssh config mpirun uses on the head."""
    counts: dict[str, int] = {}
    for r in plan.ranks:
        counts[r.host] = counts.get(r.host, 0) + 1
    t = inv.targets
    return {
        "hostfile": "".join(f"{t[h].address} slots={n}\n" for h, n in counts.items()),
        "rankfile": "".join(f"rank {r.rank}={t[r.host].address} "
                            f"slots={','.join(map(str, r.slots))}\n" for r in plan.ranks),
        "ssh_config": ssh_config(t.values(), by="address"),
    }


def _write_launch_files(ssh: _Ssh, plan: Plan, inv: Inventory, hosts: list[_Host], work: Path,
                        progress: Progress) -> None:
    folder = work / "launch"
    folder.mkdir(exist_ok=True)
    for name, text in launch_files(plan, inv).items():
        (folder / name).write_text(text)
    head = hosts[0]
    progress(head.target.host, "launch files")
    _must(["rsync", "-rpc", "-e", ssh.rsh(), f"{folder}/",
           f"{head.target.host}:{head.dir}/launch/"],
          f"{head.target.where()}: sending the launch files failed")


def mpirun_head(inv: Inventory, head: _Host, env: dict[str, str], hostfile: str,
                build: Build = PROGRAM) -> list[str]:
    """``env ... mpirun`` with what every launch from the head needs: Open MPI's ssh launcher
    with the ssh config in the head's launch folder, ``env`` set and exported to every rank,
    the hostfile, and the inventory's subnet for daemons and MPI traffic."""
    t = head.target
    launch = f"{build.root(head)}/launch"
    env_all = dict(env)
    if t.user == "root":
        env_all.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    argv = ["env", *(f"{k}={v}" for k, v in env_all.items())]
    argv += [f"{t.mpi_prefix}/bin/mpirun", "--prefix", t.mpi_prefix] if t.mpi_prefix \
        else ["mpirun"]
    argv += ["--prtemca", "plm_ssh_agent", f"ssh -F {launch}/ssh_config",
             "--prtemca", "plm_ssh_no_tree_spawn", "1",  # only the head holds the ssh config
             *(w for k in env for w in ("-x", k)), "--hostfile", hostfile]
    if inv.network:
        argv += ["--prtemca", "prte_if_include", inv.network,
                 "--mca", "btl_tcp_if_include", inv.network]
    return argv


def mpirun_argv(plan: Plan, inv: Inventory, hosts: dict[str, _Host], frames: int,
                pipeline: bool) -> list[str]:
    """The head node's mpirun command: one app context per rank, in rank order."""
    head = hosts[plan.ranks[0].host]
    launch = f"{head.dir}/launch"
    # Passive waiting: emulated hosts share this machine's cores (see run.omp_wait_policy).
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive"),
           "AUTODICE_TIMEOUT_S": os.environ.get("AUTODICE_TIMEOUT_S", "8")}
    argv = mpirun_head(inv, head, env, f"{launch}/hostfile")
    bound = honours_cores(plan, hosts)
    if bound:
        argv += ["--rankfile", f"{launch}/rankfile"]
    else:
        argv += ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"]
    for r in plan.ranks:
        d = hosts[r.host].dir
        argv += [] if r.rank == 0 else [":"]
        argv += ["-np", "1", "--wdir", d]
        if not bound:
            argv += ["--host", hosts[r.host].target.address]
        argv += ["sh", "-c", _RANK, "sh", f"{d}/results/died-{r.rank}",
                 f"{d}/build/program", "--models", f"{d}/package/models", "--inputs",
                 f"{d}/inputs", "--results", f"{d}/results", "--frames", str(frames)]
        if not pipeline:
            argv.append("--no-pipeline")
    return argv


def _run_job(ssh: _Ssh, plan: Plan, inv: Inventory, hosts: list[_Host], out_dir: Path,
             frames: int, pipeline: bool, timeout_s: float, progress: Progress) -> RunResult:
    by_name = {h.target.host: h for h in hosts}
    work = out_dir / "deploy"
    readers = {r.host for r in plan.ranks if r.inputs}

    def prepare(h: _Host) -> None:
        t = h.target
        results = shlex.quote(f"{h.dir}/results")
        clear = f"rm -rf {results} && mkdir {results}"
        if t.host in readers:
            _must(["rsync", "-rpc", "--delete", "-e", ssh.rsh(), f"--rsync-path={clear} && rsync",
                   f"{work / 'inputs'}/", f"{t.host}:{h.dir}/inputs/"], "sending the inputs failed")
        else:
            _must(ssh.script(t, 'rm -rf "$1/results" && mkdir "$1/results"', h.dir),
                  "cannot clear the results directory")

    problems = _parallel(hosts, "inputs", prepare, progress)
    if problems:
        raise AutodiceError(*problems)
    argv = mpirun_argv(plan, inv, by_name, frames, pipeline)
    log_path = work / "run.log"
    for h in hosts:
        progress(h.target.host, f"running {frames} frame{'s' * (frames > 1)}")
    code, timed_out, elapsed = run_mpirun(ssh, hosts, argv, log_path, timeout_s)
    output = log_path.read_text(errors="replace")
    if timed_out:
        raise AutodiceError(f"run: the job ran past {timeout_s:.0f} s and was stopped "
                            f"(log: {log_path})")
    if code != 0:
        raise AutodiceError(*run_failure(plan, inv, output, code, elapsed, log_path,
                                         _deaths(ssh, hosts)))
    return _collect(ssh, plan, hosts, out_dir, progress)


def run_mpirun(ssh: _Ssh, hosts: list[_Host], argv: list[str], log_path: Path,
               timeout_s: float, build: Build = PROGRAM) -> tuple[int, bool, float]:
    """Run the mpirun command ``argv`` on the head (``hosts[0]``), its output into ``log_path``.

    Stops it after ``timeout_s``; after anything but a clean exit, nothing of the job (ranks
    running ``build``'s binary, Open MPI daemons, the head's ssh sessions) survives on any host.

    Returns:
        (exit code, whether it timed out, seconds).
    """
    head = hosts[0]
    folder = f"{build.root(head)}/launch"
    pid_file = f"{folder}/mpirun.pid"
    start = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(ssh.script(head.target, _LAUNCH, pid_file,
                                           f"{folder}/mpirun.log", *argv),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:  # timed out or interrupted: stop mpirun on the head
                subprocess.run(ssh.script(head.target, _STOP, pid_file, f"{folder}/"),
                               capture_output=True, timeout=30)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.returncode != 0:  # a clean exit means mpirun already ended everything
                _reap(ssh, hosts, pid_file, build)
    return proc.returncode, timed_out, time.monotonic() - start


def _reap(ssh: _Ssh, hosts: list[_Host], pid_file: str, build: Build = PROGRAM) -> None:
    """Make sure nothing of the job survives on any host (mpirun normally sees to that)."""
    head = hosts[0]
    proc = subprocess.run(ssh.cmd(head.target, "cat", pid_file), capture_output=True, text=True,
                          timeout=30)
    job = proc.stdout.strip() if proc.stdout.strip().isdigit() else ""

    def reap(h: _Host) -> None:
        agent = f"{build.root(h)}/launch/ssh_config" if h is head else ""
        subprocess.run(ssh.script(h.target, _REAP, build.binary(h), job, agent),
                       capture_output=True, timeout=60)

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(reap, hosts))


_DEATHS = r"""
for f in "$1"/results/died-*; do [ -f "$f" ] && echo "${f##*/died-} $(cat "$f")"; done
exit 0
"""


def _deaths(ssh: _Ssh, hosts: list[_Host]) -> list[tuple[float, int, int]]:
    """(time, rank, exit code) of every rank that died of a signal, earliest first."""
    found: list[tuple[float, int, int]] = []

    def read(h: _Host) -> None:
        proc = subprocess.run(ssh.script(h.target, _DEATHS, h.dir), capture_output=True,
                              text=True, timeout=60)
        for line in proc.stdout.splitlines():
            parts = line.split()
            try:
                found.append((float(parts[1]), int(parts[0]), int(parts[2])))
            except (IndexError, ValueError):
                continue

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(read, hosts))
    return sorted(found)


def _signal_name(code: int) -> str:
    try:
        return f"signal {code - 128} ({signal.Signals(code - 128).name})"
    except ValueError:
        return f"exit code {code}"


_NOTICED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on (.*?\))")
_RANK_SAYS = re.compile(r"^\[rank (\d+) ([^\]]*)\] (.*)")
_FIRST = re.compile(r"Process name: \[\S+,(\d+)\] Exit code: (\d+)")


def run_failure(plan: Plan, inv: Inventory, output: str, code: int, seconds: float,
                log: Path, deaths: list[tuple[float, int, int]] = ()) -> list[str]:
    """One line naming the rank that failed first, its key and host, then what ranks said.

    Evidence, best first: the rank wrappers' markers (which rank died of a signal first), then
    Open MPI's own notices (its first failed process; a peer that lost its connection to a dead
    rank may abort before Open MPI notices the death, so those come second).
    """
    def rank_line(rank: int, what: str) -> str:
        r = plan.ranks[rank]
        return f"{inv.targets[r.host].where()}: run: rank {r.rank} ({r.key}) {what}"

    flat = " ".join(output.replace("\0", "").split())
    lines = []
    if deaths:
        _, rank, exit_code = deaths[0]
        lines.append(rank_line(rank, f"died: killed by {_signal_name(exit_code)}"))
    elif (m := _NOTICED.search(flat)):
        lines.append(rank_line(int(m.group(1)), f"died: it exited on {m.group(3)}"))
    said = []
    for line in output.splitlines():
        m = _RANK_SAYS.match(line)
        if m and int(m.group(1)) < len(plan.ranks):
            r = plan.ranks[int(m.group(1))]
            said.append(f"rank {r.rank} ({r.key}) on host {r.host}: {m.group(3)}")
    if not lines and said:
        lines.append(f"run: the job failed (exit {code}); {said[0]}")
        said = said[1:]
    if not lines and (m := _FIRST.search(flat)) and int(m.group(1)) < len(plan.ranks):
        lines.append(rank_line(int(m.group(1)), f"failed first (exit code {m.group(2)})"))
    if not lines:
        tail = [ln for ln in output.strip().splitlines() if ln.strip() and "setpgid" not in ln]
        lines.append(f"run: mpirun failed (exit {code})")
        said = tail[-8:]
    return [*lines, *said[:5], f"after {seconds:.1f} s; full log: {log}"]


def _collect(ssh: _Ssh, plan: Plan, hosts: list[_Host], out_dir: Path,
             progress: Progress) -> RunResult:
    results = out_dir / "results"
    results.mkdir(exist_ok=True)
    files = tensor_files(plan)
    wanted = {"stats.json", *(files[t.name] for t in plan.model_outputs)}
    for name in wanted:
        (results / name).unlink(missing_ok=True)
    makers = {plan.ranks[0].host} | {r.host for r in plan.ranks if r.outputs}

    def collect(h: _Host) -> None:
        _must(["rsync", "-r", "--include=*.npy", "--include=stats.json", "--exclude=*",
               "-e", ssh.rsh(), f"{h.target.host}:{h.dir}/results/", f"{results}/"],
              "fetching the results failed")

    problems = _parallel([h for h in hosts if h.target.host in makers], "collect", collect,
                         progress)
    if problems:
        raise AutodiceError(*problems)
    absent = sorted(n for n in wanted if not (results / n).exists())
    if absent:
        raise AutodiceError(f"collect: the job ended but {', '.join(absent)} did not "
                            f"come back into {results}")
    stats = json.loads((results / "stats.json").read_text())
    outputs = {t.name: np.load(results / files[t.name]) for t in plan.model_outputs}
    return RunResult(results, stats, outputs)
