"""Step 4 of deploy, ``run``: mpirun started on the head node across the hosts, then results.

The real-address hostfile, rankfile and an ssh config go to the head node (the host of rank 0),
which starts ``mpirun`` with Open MPI's ssh launcher; one MPMD app context per rank gives each its
own host's directory. Whatever happens, no rank of ours is left running on any host; a failure
names the rank that brought the job down, and outputs and ``stats.json`` come back into
``OUT/results/``, with each board's energy as its sensor measured it (:mod:`.board_figures`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..backend.run import ProcessJob, RunResult, model_outputs
from ..backend.session.results import write_json
from ..core.errors import AutodiceError, JobError
from ..core.outdir import tensor_files
from ..core.plan import Plan
from .board_figures import BoardWatch
from .inventory import Inventory
from .rank_exits import WRAPPER, rank_deaths, rank_exits, run_failure
from .ssh import PROGRAM, Build, Host, Progress, Ssh, must, parallel, ssh_config
from .sync import sync_folder

# Leave nothing of the job behind on a host: our ranks (their exe is our binary), the Open MPI
# daemons of our job (their namespace names mpirun's pid) and, on the head, the ssh sessions
# mpirun opened with our config (and mpirun: its command line names that config too).
# $1 program, $2 mpirun's pid or "", $3 that ssh config or "".
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
# the ssh channel open), record its pid, wait, then print the output. The script's stdin is a
# pipe the autodice process holds and never writes (``ProcessJob``'s ``held``): EOF there means
# that process or its ssh went, however (SIGKILL included), and a watcher then ends mpirun,
# which ends every rank: a job never outlives its owner on the hosts either.
# Open MPI 5's mpirun now and then hangs once its job has ended (openpmix/prrte#1839: every
# process gone, mpirun deadlocked in its teardown; 1 run in 5 of the killed-rank test here). A
# watchdog beside it: once mpirun has had children and none of them has been alive for
# HUNG_AFTER_S seconds, it kills mpirun and the script exits MPIRUN_HUNG; the ranks' exit
# markers then say how the job really ended (HeadJob). Killed as soon as mpirun exits by itself.
# Now and then Open MPI 5's mpirun cannot start its PMIx server's listener and exits before any
# rank starts (twice in the emulated cluster's tests here: measuring links on 2026-11-26, and
# restarting a session after a host's link went down on 2026-11-27; in another project's log of
# it PMIx first said "problems getting address for index 0 (kernel index -1)", an interface gone
# while it listed them). Nothing ran: the script launches again, up to three times in all.
# So too when a host's daemon (prted) exits 213 before it reports back to mpirun: a status that
# says it printed its reason itself, which ssh does not bring back. It ended clean-clone CI runs
# here now and then (2026-11-28 and 29; the last one the aarch64 board's daemon under qemu, with
# nothing else running); its cause is not found. A host that is gone shows another status (255:
# ssh could not reach it), and fails at once as before.
STARTLESS = ("listener thread failed to start", "Daemon exit status: 213")
MPIRUN_HUNG = 75  # the launch script's exit code when its watchdog stopped a hung mpirun
HUNG_AFTER_S = 5
_LAUNCH = r"""
pidfile=$1; log=$2; patience=$3; shift 3
rm -f "$pidfile.hung"
exec 3<&0
tries=3
while :; do
  "$@" > "$log" 2>&1 < /dev/null &
  job=$!
  echo $job > "$pidfile"
  ( while read -r _; do :; done; kill -TERM $job ) <&3 > /dev/null 2>&1 &
  owner=$!
  (
    seen=; idle=0
    while sleep 1; do
      live=
      for c in $(cat /proc/$job/task/*/children 2>/dev/null); do
        s=$(sed 's/.*) //; s/ .*//' "/proc/$c/stat" 2>/dev/null)
        [ -n "$s" ] && [ "$s" != Z ] && live=1
      done
      if [ -n "$live" ]; then seen=1; idle=0
      elif [ -n "$seen" ]; then
        idle=$((idle + 1))
        [ "$idle" -ge "$patience" ] && : > "$pidfile.hung" && kill -KILL $job && exit 0
      fi
    done
  ) > /dev/null 2>&1 < /dev/null &
  watch=$!
  wait $job 2> /dev/null
  code=$?
  kill $watch $owner 2>/dev/null
  tries=$((tries - 1))
  [ $code -ne 0 ] && [ $tries -gt 0 ] && grep -qE "$STARTLESS" "$log" || break
done
cat "$log"
[ -f "$pidfile.hung" ] && echo "autodice: mpirun hung after its last process ended; stopped" \
  && exit MPIRUN_HUNG
exit $code
""".replace("MPIRUN_HUNG", str(MPIRUN_HUNG)).replace("$STARTLESS", "|".join(STARTLESS))
_STOP = r"""
pid=$(cat "$1" 2>/dev/null) || exit 0
grep -q "$2" "/proc/$pid/cmdline" 2>/dev/null && kill -TERM "$pid"
exit 0
"""


def check_launchable(inv: Inventory) -> None:
    """What mpirun needs of the inventory as a whole (before any network use)."""
    problems = []
    prefixes = {t.mpi_prefix for t in inv.targets.values()}
    if len(prefixes) > 1:
        problems.append(f"{inv.path}: hosts name different mpi_prefix values "
                        f"({', '.join(sorted(str(p) for p in prefixes))}); mpirun starts its "
                        "daemons from one prefix on every host")
    if problems:
        raise AutodiceError(*problems)


def honours_cores(plan: Plan, hosts: dict[str, Host]) -> bool:
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
    """hostfile and rankfile with real addresses, and the ssh config mpirun uses on the head;
    ``rankfile.stream`` adds a session's gateway (one rank more, on rank 0's first core)."""
    counts: dict[str, int] = {}
    for r in plan.ranks:
        counts[r.host] = counts.get(r.host, 0) + 1
    t = inv.targets
    rankfile = "".join(f"rank {r.rank}={t[r.host].address} "
                       f"slots={','.join(map(str, r.slots))}\n" for r in plan.ranks)
    first = plan.ranks[0]
    return {
        "hostfile": "".join(f"{t[h].address} slots={n + (h == first.host)}\n"
                            for h, n in counts.items()),
        "rankfile": rankfile,
        "rankfile.stream": rankfile + (f"rank {len(plan.ranks)}={t[first.host].address} "
                                       f"slots={first.slots[0]}\n"),
        "ssh_config": ssh_config(t.values(), by="address"),
    }


def write_launch_files(ssh: Ssh, plan: Plan, inv: Inventory, hosts: list[Host], work: Path,
                       progress: Progress) -> None:
    """:func:`launch_files` into ``work/launch`` here, then into the head's launch folder (the
    head is ``hosts[0]``, the host of rank 0) unless it holds them already."""
    folder = work / "launch"
    folder.mkdir(exist_ok=True)
    for name, text in launch_files(plan, inv).items():
        (folder / name).write_text(text)
    head = hosts[0]
    progress(head.target.host, "launch files")
    sent = head.sent
    sync_folder(ssh, head, folder, head.dir, "launch",
                what=f"{head.target.where()}: sending the launch files failed")
    head.sent = sent  # what the report counts is the package


def mpirun_head(inv: Inventory, head: Host, env: dict[str, str], hostfile: str,
                build: Build = PROGRAM) -> list[str]:
    """``env ... mpirun`` with what every launch from the head needs: Open MPI's ssh launcher
    with the ssh config in the head's launch folder, ``env`` set and exported to every rank,
    the hostfile, the inventory's subnet for daemons and MPI traffic, and TCP's progress thread.

    Over TCP a message above 64 KiB waits for its receiver's answer, which the sender hears only
    inside an MPI call, and a rank computing a frame makes none: a tensor sent at a frame's end
    moved at the next frame's first MPI call. Open MPI's TCP progress thread answers meanwhile.
    ResNet-50 with one layer sent to the other host and back each frame (2 emulated hosts, 1
    Gbit/s): the round trip took 16.5 ms instead of 2.4, 12.2 instead of 15.6 frames/s."""
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
             *(w for k in env for w in ("-x", k)), "--hostfile", hostfile,
             "--mca", "btl_tcp_progress_thread", "1"]
    if inv.network:
        argv += ["--prtemca", "prte_if_include", inv.network,
                 "--mca", "btl_tcp_if_include", inv.network]
    return argv


def mpirun_argv(plan: Plan, inv: Inventory, hosts: dict[str, Host], flags: list[str],
                gateway: bool = False) -> list[str]:
    """The head node's mpirun command: one app context per rank, in rank order, and with
    ``gateway`` a session's gateway after them (rank n, on the head: it shares rank 0's first
    core, where it mostly sleeps)."""
    head = hosts[plan.ranks[0].host]
    launch = f"{head.dir}/launch"
    # Passive waiting: emulated hosts share this machine's cores (see run.omp_wait_policy).
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive"),
           "AUTODICE_TIMEOUT_S": os.environ.get("AUTODICE_TIMEOUT_S", "8")}
    argv = mpirun_head(inv, head, env, f"{launch}/hostfile")
    bound = honours_cores(plan, hosts)
    if bound:
        argv += ["--rankfile", f"{launch}/rankfile.stream" if gateway else f"{launch}/rankfile"]
        argv += ["--bind-to", "core:overload-allowed"] if gateway else []
    else:
        argv += ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"]
    for rank, key in enumerate([r.host for r in plan.ranks] + [head.target.host] * gateway):
        d = hosts[key].dir
        argv += [] if rank == 0 else [":"]
        argv += ["-np", "1", "--wdir", d]
        if not bound:
            argv += ["--host", hosts[key].target.address]
        argv += ["sh", "-c", WRAPPER, "sh", f"{d}/results/exit-{rank}",
                 f"{d}/build/program", "--models", f"{d}/package/models", "--inputs",
                 f"{d}/inputs", "--results", f"{d}/results", *flags]
    return argv


def run_job(ssh: Ssh, plan: Plan, inv: Inventory, hosts: list[Host], out_dir: Path,
            flags: list[str], timeout_s: float, progress: Progress) -> RunResult:
    """Inputs out to the hosts whose ranks read them, the job run from the head, results back.

    Raises:
        AutodiceError: inputs that did not arrive, a job that ran past ``timeout_s`` or failed
            (:func:`run_failure`), or results that did not come back.
    """
    by_name = {h.target.host: h for h in hosts}
    work = out_dir / "deploy"
    readers = {r.host for r in plan.ranks if r.inputs}

    def prepare(h: Host) -> None:
        t = h.target
        results = shlex.quote(f"{h.dir}/results")
        clear = f"rm -rf {results} && mkdir {results}"
        if t.host in readers:
            must(["rsync", "-rpc", "--delete", "-e", ssh.rsh(), f"--rsync-path={clear} && rsync",
                  f"{work / 'inputs'}/", f"{t.host}:{h.dir}/inputs/"], "sending the inputs failed")
        else:
            must(ssh.script(t, 'rm -rf "$1/results" && mkdir "$1/results"', h.dir),
                 "cannot clear the results directory")

    problems = parallel(hosts, "inputs", prepare, progress)
    if problems:
        raise AutodiceError(*problems)
    argv = mpirun_argv(plan, inv, by_name, flags)
    log_path = work / "run.log"
    for h in hosts:
        progress(h.target.host, "running")
    with BoardWatch(ssh, hosts) as boards:  # their sensors, while the job runs
        boards.start(None)
        code, timed_out, elapsed = run_mpirun(ssh, hosts, argv, log_path, timeout_s,
                                              ranks=len(plan.ranks))
    output = log_path.read_text(errors="replace")
    if timed_out:
        raise AutodiceError(f"run: the job ran past {timeout_s:.0f} s and was stopped "
                            f"(log: {log_path})")
    if code != 0:
        raise JobError(*run_failure(plan, inv, output, code, elapsed, log_path,
                                         rank_deaths(ssh, hosts)))
    result = _collect(ssh, plan, hosts, out_dir, progress)
    result.stats["energy"] = boards.report(result.stats["frames"], result.stats["seconds"])
    write_json(result.results / "stats.json", result.stats)
    return result


def run_mpirun(ssh: Ssh, hosts: list[Host], argv: list[str], log_path: Path,
               timeout_s: float, build: Build = PROGRAM, ranks: int = 0
               ) -> tuple[int, bool, float]:
    """Run the mpirun command ``argv`` on the head (``hosts[0]``), its output into ``log_path``.

    Stops it after ``timeout_s``; after anything but a clean exit, nothing of the job (ranks
    running ``build``'s binary, Open MPI daemons, the head's ssh sessions) survives on any host.
    ``ranks``: how many ranks run under the rank wrapper (see :class:`HeadJob`).

    Returns:
        (exit code, whether it timed out, seconds).
    """
    job = HeadJob(ssh, hosts, argv, log_path, build, ranks=ranks)
    try:
        code = job.wait(timeout_s)
    finally:
        job.stop()
    return job.outcome(job.proc.returncode), code is None, job.seconds


class HeadJob(ProcessJob):
    """The mpirun command ``argv`` started on the head (``hosts[0]``) over ssh, its output into
    ``log_path``. ``stop()`` ends it, and after anything but a clean exit leaves nothing of the
    job (ranks running ``build``'s binary, Open MPI daemons, the head's ssh sessions) on any
    host. ``ssh_options`` go to the ssh command that carries mpirun (a session's forward).

    ``ranks`` is how many ranks run under the rank wrapper (their exit markers): when the launch
    script had to stop an mpirun that hung after its job (:data:`MPIRUN_HUNG`), the job's exit
    code is the ranks' own — 0 when all of them ended with 0 — not the hang's.
    """

    def __init__(self, ssh: Ssh, hosts: list[Host], argv: list[str], log_path: Path,
                 build: Build = PROGRAM, ssh_options: tuple[str, ...] = (), ranks: int = 0):
        self.ssh, self.hosts, self.build, self.ranks = ssh, hosts, build, ranks
        self._outcome: int | None = None
        head = self._head = hosts[0]
        self.folder = f"{build.root(head)}/launch"  # in every rank's command line: names mpirun
        job = f"{build.root(head)}/job"
        self.pid_file = f"{job}/mpirun.pid"
        cmd = ssh.script(head.target, _LAUNCH, self.pid_file, f"{job}/mpirun.log",
                         str(HUNG_AFTER_S), *argv, held=True)
        cmd[1:1] = ssh_options
        self._start = time.monotonic()
        self._ended: float | None = None
        self._patience_s = 15.0
        super().__init__(cmd, log_path, held=True)

    def lose(self, hosts: set[str]) -> None:
        """``hosts`` no longer answer: stopping the job reaps nothing there, and gives mpirun
        (which waits on its daemons there in vain) a second, not fifteen."""
        kept = [h for h in self.hosts if h.target.host not in hosts]
        if len(kept) < len(self.hosts):
            self.hosts, self._patience_s = kept, 1.0

    @property
    def seconds(self) -> float:
        return (self._ended or time.monotonic()) - self._start

    def poll(self) -> int | None:
        return self.outcome(super().poll())

    def wait(self, timeout: float) -> int | None:
        return self.outcome(super().wait(timeout))

    def outcome(self, code: int | None) -> int | None:
        """The job's exit code given the launch script's: after a hung mpirun was stopped, the
        first non-zero exit of a rank, else 0 once every rank has a marker saying 0."""
        if code != MPIRUN_HUNG:
            return code
        if self._outcome is None:
            exits = rank_exits(self.ssh, self.hosts) if self.ranks else []
            failed = [e.code for e in exits if e.code != 0]
            self._outcome = (failed[0] if failed else
                             0 if len(exits) == self.ranks else MPIRUN_HUNG)
        return self._outcome

    def stop(self) -> None:
        """End the job now if it still runs; then make sure nothing of it is left anywhere."""
        if self._ended is not None:
            return
        # A lost head takes its mpirun along; the pid file and folder named here are the head's,
        # so another host (head of a job of its own, say) gets neither.
        head_here = bool(self.hosts) and self.hosts[0] is self._head
        if self.proc.poll() is None:
            if head_here:
                subprocess.run(self.ssh.script(self._head.target, _STOP, self.pid_file,
                                               f"{self.folder}/"), capture_output=True,
                               timeout=30)
            if self.wait(self._patience_s) is None:
                self.proc.kill()
                self.proc.wait()
        self._ended = time.monotonic()
        if self.proc.returncode != 0 and self.hosts:  # a clean exit: mpirun ended everything
            reap(self.ssh, self.hosts, self.pid_file if head_here else "", self.build)


def reap(ssh: Ssh, hosts: list[Host], pid_file: str, build: Build = PROGRAM) -> None:
    """Make sure nothing of the job survives on any host (mpirun normally sees to that).
    ``hosts[0]`` is the head, where ``pid_file`` names mpirun; "" when no mpirun is known (a
    host that comes back: only ``build``'s ranks are ended there)."""
    head = hosts[0]
    job = ""
    if pid_file:
        proc = subprocess.run(ssh.cmd(head.target, "cat", pid_file), capture_output=True,
                              text=True, timeout=30)
        job = proc.stdout.strip() if proc.stdout.strip().isdigit() else ""

    def one(h: Host) -> None:
        agent = f"{build.root(h)}/launch/ssh_config" if h is head and pid_file else ""
        subprocess.run(ssh.script(h.target, _REAP, build.binary(h), job, agent),
                       capture_output=True, timeout=60)

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(one, hosts))


def _collect(ssh: Ssh, plan: Plan, hosts: list[Host], out_dir: Path,
             progress: Progress) -> RunResult:
    results = out_dir / "results"
    results.mkdir(exist_ok=True)
    files = tensor_files(plan)
    wanted = {"stats.json", *(files[t.name] for t in plan.model_outputs)}
    for name in wanted:
        (results / name).unlink(missing_ok=True)
    makers = {plan.ranks[0].host} | {r.host for r in plan.ranks if r.outputs}

    def collect(h: Host) -> None:
        must(["rsync", "-r", "--include=*.npy", "--include=stats.json", "--exclude=*",
              "-e", ssh.rsh(), f"{h.target.host}:{h.dir}/results/", f"{results}/"],
             "fetching the results failed")

    problems = parallel([h for h in hosts if h.target.host in makers], "collect", collect,
                        progress)
    if problems:
        raise AutodiceError(*problems)
    absent = sorted(n for n in wanted if not (results / n).exists())
    if absent:
        raise AutodiceError(f"collect: the job ended but {', '.join(absent)} did not "
                            f"come back into {results}")
    stats = json.loads((results / "stats.json").read_text())
    return RunResult(results, stats, model_outputs(plan, results))
