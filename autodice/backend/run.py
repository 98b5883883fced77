"""``autodice run``: every rank on this machine under ``mpirun``, then outputs and stats.

Hosts are mapped to localhost. The rankfile's cores are used as they are when they exist here and
no two ranks share one; otherwise ranks run unbound with ``--oversubscribe`` (Open MPI's default
binding with two ranks would pin each rank's threads to one core).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError, JobError
from ..core.outdir import claim, tensor_files
from ..core.owned import spawn
from ..core.plan import Plan, load_plan
from ..frontend.check import RTOL, RTOL_FP16, RTOL_INT8
from .engine import mpi_prefix
from .failure import explain_failure, without_notices
from .power import EnergyMeter, find_sensor
from .session import Session
from .session.frames import open_npy
from .session.job import job_log, own_folder
from .session.results import write_json
from .wire import Wire


@dataclass(frozen=True)
class RunResult:
    results: Path
    stats: dict
    outputs: dict[str, np.ndarray]
    warnings: tuple[str, ...] = ()


def binding_problems(plan: Plan, stats: dict) -> list[str]:
    """Ranks whose OpenMP threads did not run on as many cores as the key gives them.

    The program reports the cores each rank may use and those its threads were on at one moment
    while all were busy; fewer than asked means the threads share cores (a binding mistake, or
    more threads than this machine has).
    """
    problems = []
    for r, s in zip(plan.ranks, stats["ranks"]):
        if r.device == "cpu" and len(s["omp_cpus"]) < r.threads:
            problems.append(f"rank {r.rank} ({r.key}): its {r.threads} threads ran on "
                            f"{len(s['omp_cpus'])} core(s); it may use cores "
                            f"{','.join(map(str, s['cpus']))}")
    return problems


def local_binding(plan: Plan, cpus: set[int]) -> list[str] | None:
    """Rankfile lines for this machine, or None when the plan's cores cannot be honoured here:
    one it may not use (``cpus``: its affinity, which a container's cpuset or taskset narrows
    below the machine's count), or one two ranks share."""
    used: set[int] = set()
    for r in plan.ranks:
        if any(c not in cpus or c in used for c in r.slots):
            return None
        used.update(r.slots)
    return [f"rank {r.rank}=localhost slots={','.join(map(str, r.slots))}" for r in plan.ranks]


def omp_wait_policy(plan: Plan, n_cpus: int) -> dict[str, str]:
    """The OpenMP wait policy for the ranks' environment.

    Idle OpenMP threads spin for a while by default, which is fastest when every thread has a
    core (2 threads on 2 cores: 1.4x one thread, but slower than one thread when they sleep).
    When the ranks' threads outnumber the cores, spinning threads steal the cores their
    neighbours need (about 2x slower, FACTS.md), so they must sleep instead. The user's own
    OMP_WAIT_POLICY wins.
    """
    if "OMP_WAIT_POLICY" in os.environ or sum(r.threads for r in plan.ranks) <= n_cpus:
        return {}
    return {"OMP_WAIT_POLICY": "passive"}


def check_inputs(plan: Plan, inputs: dict[str, Path]) -> dict[str, np.ndarray]:
    """Each model input's array, read from its .npy and checked against the plan.

    Raises:
        AutodiceError: a missing input, a file that is not a .npy array, or an array of the
            wrong shape or dtype.
    """
    arrays = {}
    for t in plan.model_inputs:
        path = inputs.get(t.name)
        if path is None:
            raise AutodiceError(f'no input given for model input "{t.name}" '
                                f"(shape {'x'.join(map(str, t.shape))} {t.dtype})")
        array = open_npy(path)
        if array.shape != t.shape or array.dtype != np.dtype(t.dtype):
            raise AutodiceError(f'{path}: model input "{t.name}" must be '
                                f"{'x'.join(map(str, t.shape))} {t.dtype}, got "
                                f"{'x'.join(map(str, array.shape))} {array.dtype}")
        array = np.array(array)
        if array.dtype.kind == "f" and not np.isfinite(array).all():  # as a stream refuses it
            raise AutodiceError(f'{path}: model input "{t.name}" holds NaN or infinite values')
        arrays[t.name] = array
    return arrays


def stage_inputs(plan: Plan, inputs: dict[str, Path], dest: Path) -> None:
    """Check each input .npy against the plan (all of them first), then copy them where the
    program reads them.

    Raises:
        AutodiceError: as :func:`check_inputs`.
    """
    arrays = check_inputs(plan, inputs)
    dest.mkdir(parents=True, exist_ok=True)
    files = tensor_files(plan)
    for name, array in arrays.items():
        np.save(dest / files[name], np.ascontiguousarray(array))


def program_flags(frames: int, pipeline: bool = True, gpu_fallback: bool = False) -> list[str]:
    """The program's options for a job (see runtime_cpp/autodice_program.cpp), here or deployed.

    Raises:
        AutodiceError: fewer than one frame.
    """
    if frames < 1:
        raise AutodiceError(f"--frames {frames}: need at least 1 frame")
    return (["--frames", str(frames)] + ([] if pipeline else ["--no-pipeline"])
            + (["--gpu-fallback", "cpu"] if gpu_fallback else []))


def check_tolerance(stats: dict, wire: Wire = Wire()) -> tuple[float, str]:
    """The relative tolerance a run's outputs are held to against onnxruntime, and why.

    The bound is fp16's (:data:`~autodice.frontend.check.RTOL_FP16`) whenever a rank computed
    in fp16 or tensors crossed hosts as fp16; int8's, whenever a rank computed in int8 or
    tensors crossed as int8: loose enough for what quantization moves, tight enough that a
    wrong scale fails (``check OUT --frames`` measures what int8 loses).
    """
    for precision, bound in (("int8", RTOL_INT8), ("fp16", RTOL_FP16)):
        found = [str(r["rank"]) for r in stats["ranks"] if r.get("precision") == precision]
        why = ([f"{precision} on rank{'s' if len(found) > 1 else ''} {', '.join(found)}"]
               if found else []) + ([f"tensors cross hosts as {precision}"]
                                    if wire.kind == precision else [])
        if why:
            return bound, "; ".join(why)
    return RTOL, "fp32 on every rank"


_FOREVER_S = 10.0 ** 9  # "no limit", as a limit: see ProcessJob.wait
SHM = "/dev/shm"  # where a local job's shared-memory files go, in a folder of its own


class ProcessJob:
    """A job's one process here (mpirun, or the ssh that runs mpirun on a head node), its output
    into ``log``. Its own process group: Ctrl-C reaches Python, which stops the job in order.
    It ends with this process, however this one ends (:mod:`~autodice.core.owned`).

    ``held``: its stdin is a pipe nothing writes and this process holds open while the job runs;
    EOF there means that its owner went (an ssh carries it to the command on the host).
    """

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None,
                 held: bool = False):
        self.log = log
        with open(log, "wb") as f:
            self.proc = spawn(argv, env=env, stdin=subprocess.PIPE if held else subprocess.DEVNULL,
                              stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def poll(self) -> int | None:
        return self._done(self.proc.poll())

    def wait(self, timeout: float | None) -> int | None:
        """The exit code, or None if it still runs after ``timeout`` seconds (None: no limit).

        Always Popen's polling wait, never one blocking waitpid: the kernel may hand SIGTERM to
        another thread (the forker's, rich's refresh), and Python runs its handler in the main
        thread only between bytecodes, so a blocked waitpid kept `autodice run` and its job
        running past a SIGTERM (seen once in four CI runs).
        """
        try:
            return self._done(self.proc.wait(_FOREVER_S if timeout is None else timeout))
        except subprocess.TimeoutExpired:
            return None

    def _done(self, code: int | None) -> int | None:
        if code is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return code


def local_mpirun(plan: Plan, program: Path, folder: Path, args: list[str],
                 gateway: bool = False) -> tuple[list[str], dict[str, str]]:
    """The mpirun command and environment that run every rank of ``plan`` here (the rankfile,
    when the plan's cores exist here, written into ``folder``), plus a stream's gateway as the
    last rank when ``gateway``: it shares rank 0's first core, where it mostly sleeps."""
    cpus = os.sched_getaffinity(0)
    cmd = [str(mpi_prefix() / "bin" / "mpirun"), "-np", str(len(plan.ranks) + gateway)]
    lines = local_binding(plan, cpus)
    if lines is None:
        cmd += ["--oversubscribe", "--bind-to", "none"]
    else:
        if gateway:
            lines.append(f"rank {len(plan.ranks)}=localhost slots={plan.ranks[0].slots[0]}")
            cmd += ["--bind-to", "core:overload-allowed"]
        (folder / "rankfile.local").write_text("\n".join(lines) + "\n")
        cmd += ["--rankfile", str(folder / "rankfile.local")]
    cmd += [str(program.resolve()), *args]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               **omp_wait_policy(plan, len(cpus)))
    return cmd, env


class LocalJob(ProcessJob):
    """Every rank and the gateway on this machine under mpirun, output to ``log``.

    Each rank's Open MPI shares memory through a 16 MB file in /dev/shm that it removes as it
    finalizes: a rank that died (a crash, the OOM killer) left its job's files there for good,
    16 MB a process, and a local stream restarted after losses for days fills the machine's
    RAM. So a job keeps them in a folder of its own (``btl_sm_backing_directory``), removed
    once the job has ended however it ended, or, if autodice itself was killed, by the next
    job (:func:`~.session.job.own_folder`).
    """

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, plan: Plan):
        try:
            self.shm: Path | None = own_folder(Path(SHM), "job")
            argv = [argv[0], "--mca", "btl_sm_backing_directory", str(self.shm), *argv[1:]]
        except OSError:  # no /dev/shm here: Open MPI's default place
            self.shm = None
        super().__init__(argv, log, env)
        self.plan = plan

    def stop(self) -> None:
        if self.proc.poll() is None:  # mpirun ends its ranks on SIGTERM
            self.proc.terminate()
            if self.wait(15) is None:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._done(self.proc.returncode)

    def _done(self, code: int | None) -> int | None:
        if code is not None and self.shm is not None:  # mpirun has ended its ranks
            shutil.rmtree(self.shm, ignore_errors=True)
            self.shm = None
        return super()._done(code)

    def failure(self, code: int | None) -> list[str]:
        said = self.log.read_text(errors="replace")
        ranks_said = [ln for ln in said.splitlines() if ln.startswith("[rank")]
        rest = [ln for ln in without_notices(said.splitlines()) if ln.strip()]
        return [f"the job failed (exit {code}):", *explain_failure(self.plan, said),
                *(ranks_said[-5:] or rest[-8:]), f"log: {self.log}"]


def local_job(out_dir: Path, plan: Plan, socket_path: str, gpu_fallback: bool = False) -> LocalJob:
    """Start every rank of ``out_dir``'s built program here, plus the gateway on rank 0's core
    (its files beside the socket, in the session's folder)."""
    program = out_dir / "packages" / plan.ranks[0].host / "build" / "program"
    if not program.exists():
        raise AutodiceError(f"{program}: not built; run `autodice build {out_dir}` first")
    workdir = Path(socket_path).parent
    args = ["--models", str(out_dir / "ncnn"), "--stream", socket_path]
    argv, env = local_mpirun(plan, program, workdir, args + (["--gpu-fallback", "cpu"]
                                                             if gpu_fallback else []),
                             gateway=True)
    return LocalJob(argv, env, job_log(), plan)


def run(out_dir: str | Path, inputs: dict[str, Path], frames: int = 1,
        results: str | Path | None = None, pipeline: bool = True,
        timeout_s: float | None = None, gpu_fallback: bool = False) -> RunResult:
    """Run the built program with all ranks on this machine.

    Args:
        timeout_s: stop the job after this long (None: it runs until done; a rank that waits
            in vain for a peer ends it anyway, by its watchdog).
        gpu_fallback: a GPU rank on a host without a Vulkan device computes on its CPU (and
            says so in stats.json) instead of failing.

    Raises:
        AutodiceError: fewer than one frame, not built, bad inputs, a results folder that cannot
            be written, or the job failed (the ranks' last lines shown). All but the last before
            anything is written.
    """
    out_dir = Path(out_dir)
    if frames < 1:
        raise AutodiceError(f"--frames {frames}: need at least 1")
    plan = load_plan(out_dir)
    program = out_dir / "packages" / plan.ranks[0].host / "build" / "program"
    if not program.exists():
        raise AutodiceError(f"{program}: not built; run `autodice build {out_dir}` first")
    check_inputs(plan, inputs)
    if results is None:
        results = out_dir / "results"
        claim(out_dir, "results/")
    results = Path(results)
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AutodiceError(f"{results}: cannot write the results there ({e.strerror})") from None
    stage_inputs(plan, inputs, results / "inputs")
    cmd, env = local_mpirun(plan, program, results,
                            ["--models", str(out_dir / "ncnn"), "--inputs",
                             str(results / "inputs"), "--results", str(results),
                             *program_flags(frames, pipeline, gpu_fallback)])
    files = tensor_files(plan)
    for name in ("stats.json", *(files[t.name] for t in plan.model_outputs)):
        (results / name).unlink(missing_ok=True)  # an earlier run's: none may pass for this one's
    meter = EnergyMeter(find_sensor())
    job = LocalJob(cmd, env, results / "job.log", plan)  # its own process group
    try:
        code = _wait_metered(job, timeout_s, meter)
    finally:
        job.stop()  # past the time, or Ctrl-C: mpirun ends its ranks, in order
    if code is None:
        raise AutodiceError(f"the job ran past {timeout_s:.0f} s and was stopped "
                            f"(log: {job.log})")
    if code != 0 or not (results / "stats.json").exists():
        raise JobError(*job.failure(code))
    stats = json.loads((results / "stats.json").read_text())
    stats["energy"] = {socket.gethostname(): meter.report(stats["frames"], stats["seconds"])}
    write_json(results / "stats.json", stats)
    outputs = model_outputs(plan, results)
    return RunResult(results, stats, outputs, tuple(binding_problems(plan, stats)))


def _wait_metered(job: LocalJob, timeout_s: float | None, meter: EnergyMeter) -> int | None:
    """``job.wait(timeout_s)``, reading this machine's energy meanwhile where it has a sensor
    (:mod:`.power`): the job's own loop tells no one when its frames pass."""
    if meter.sensor is None:
        return job.wait(timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        meter.sample(0)
        left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
        code = job.wait(max(left, 0.0))
        if code is not None or (deadline is not None and time.monotonic() >= deadline):
            meter.sample(0)
            return code


def model_outputs(plan: Plan, results: Path) -> dict[str, np.ndarray]:
    """The outputs a job wrote into ``results``, in the shapes the model gives them (the
    program writes each as its Mat holds it: the same bytes), rewritten so where they differ."""
    files = tensor_files(plan)
    outputs = {}
    for t in plan.model_outputs:
        a = np.load(results / files[t.name])
        if a.shape != t.onnx_shape:
            a = a.reshape(t.onnx_shape)
            np.save(results / files[t.name], a)
        outputs[t.name] = a
    return outputs


def open_session(out_dir: str | Path, window: int | None = None,
                 gpu_fallback: bool = False) -> Session:
    """A session over every rank of ``out_dir``'s built program on this machine.

    Raises:
        AutodiceError: not built, or the job failed to start (the rank named).
    """
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    return Session(plan, lambda path: local_job(out_dir, plan, path, gpu_fallback), window)
