"""A board that dies mid-stream: a mapping onto the boards left, deployed, and the stream goes on.

``autodice.open(out, inventory=..., recover=True)`` gives the session (:mod:`..backend.session`)
a :class:`DeployedRecovery`. When the job dies it:

1. **finds what was lost**: every host is asked over its ssh connection to answer within a few
   seconds (a board that lost power or its link does not); the job is stopped, nothing of it
   left on the hosts that answer; the job's own evidence (death markers, mpirun's notice, the
   ranks' watchdogs: :func:`~autodice.backend.failure.culprits`) names the ranks that brought
   it down. Their hosts and the silent ones are lost. The head (rank 0's host: the input enters
   there and the session's gateway runs there) cannot be: that is a clear error.
2. **picks a mapping for the hosts left**: the fastest point of a DSE front (``recover=FRONT``,
   a ``dse`` output folder) that uses only those hosts, else the original mapping's keys on
   those hosts with the layers cut into balanced runs (``layers --balance``, by FLOPs).
3. **splits, generates and deploys it**: into ``OUT/recovery/without-HOSTS/``, shipped into
   ``<remote_dir>/without-HOSTS/`` on each host left (the original deployment stays as it is,
   for :meth:`rebalance`), with the ncnn the first deploy used. A fallback for the loss of each
   host still running is prepared and shipped ahead, in the background, while the stream runs
   (again after each recovery and rebalance), so recovery from a loss, the first or a later
   one, is a quick re-check and a restart, not a compile.

The session then starts the new job and sends again every frame whose result had not come back.
``rebalance()`` moves back to the original mapping on every host once the lost ones answer
again; until then a host that comes back is not used.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from ..backend.failure import culprits
from ..backend.session.job import Restart
from ..core.errors import AutodiceError
from ..core.mapping import mapping_from, mapping_json, parse_mapping
from ..core.names import file_slug
from ..core.outdir import claim
from ..core.plan import Plan, load_plan
from .deploy import Shipped, ship
from .inventory import Inventory
from .launch import reap
from .rank_exits import deaths_of, rank_exits, run_failure, vanished
from .remote_build import ncnn_prefixes
from .remote_job import RemoteJob
from .ssh import PROGRAM, Build, Progress

ANSWER_S = 3.0  # a host that does not run `true` over its open connection in this time is lost


@dataclass(frozen=True)
class Fallback:
    """The job for the hosts left after losing some: its output folder and inventory."""

    out: Path  # OUT/recovery/without-HOSTS: split + gen of ``mapping``
    inventory: Inventory  # the hosts left, each in <remote_dir>/without-HOSTS
    mapping: dict[str, list[str]]
    source: str  # where the mapping came from, for the incident report


class DeployedRecovery:
    """The session's recovery on deployed hosts (see the module docstring)."""

    def __init__(self, shipped: Shipped, gpu_fallback: bool = False, front: Path | None = None,
                 ahead: bool = True, progress: Progress | None = None):
        self.out_dir = shipped.out_dir
        self.plan = shipped.plan  # the original: all hosts
        self.inv = shipped.inv
        self.head = shipped.plan.ranks[0].host
        self.front = Path(front) if front is not None else None
        self.gpu_fallback = gpu_fallback
        self.progress = progress or (lambda host, step: None)
        self.keep_s = shipped.ssh.keep_s
        self.ncnn = ncnn_prefixes(shipped.hosts, frozenset(
            r.host for r in shipped.plan.ranks if r.device == "gpu"))
        self.lost: set[str] = set()
        self.stale: set[str] = set()  # lost hosts that may still run a rank of ours
        self._closed = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autodice-fallback")
        self._ready: dict[frozenset[str], Future] = {}
        self._lock = threading.Lock()  # one split/gen/ship of a fallback at a time
        self.ahead = ahead
        self._prepare_ahead()

    def _prepare_ahead(self) -> None:
        """With ``ahead``: in the background, the job for the loss of each host still running
        (the head aside) on top of those lost already, so the next loss, the second one too,
        finds its job shipped."""
        if not self.ahead:
            return
        for host in self.plan.hosts()[1:]:
            if host not in self.lost:
                key = frozenset(self.lost | {host})
                if key not in self._ready or self._ready[key].cancelled():
                    self._ready[key] = self._pool.submit(self._prepare, key)

    def _start(self, shipped: Shipped) -> Restart:
        return Restart(shipped.plan, lambda path: RemoteJob(shipped, path, self.gpu_fallback))

    # ---- the session's calls ---------------------------------------------------------------

    def recover(self, job: RemoteJob) -> Restart:
        """Stop the dead ``job``, find the hosts lost, and deploy the job for those left.

        Raises:
            AutodiceError: the failure was not a host lost (what brought the job down), the head
                was lost, or no job can be made for the hosts left.
        """
        t0 = time.monotonic()
        lost, lines = self._find_lost(job)
        detected = time.monotonic()
        if not lost:
            raise AutodiceError(*lines)
        if self.head in lost:
            raise AutodiceError(*lines, f"{self.head} is lost: it holds the input rank and the "
                                "session's gateway, and recovering from its loss is out of scope")
        self.lost |= lost
        self.stale |= lost
        key = frozenset(self.lost)
        for other, future in self._ready.items():
            if other != key:
                future.cancel()  # not started yet: not needed now
        prepared = self._ready.get(key)
        ready = prepared is not None and prepared.done() and not prepared.cancelled() \
            and prepared.exception() is None
        try:
            fallback = prepared.result() if prepared is not None else None
        except Exception:  # noqa: BLE001 - its preparation failed: try once more, and say why
            fallback = None
        if fallback is None:  # none prepared (or cancelled, or failed): make it now
            fallback = self._prepare(key, force=True)
        planned = time.monotonic()
        shipped = ship(fallback.out, fallback.inventory, self.progress, self.keep_s)
        shipped_at = time.monotonic()
        restart = self._start(shipped)
        restart.incident.update({
            "lost": sorted(lost), "why": lines[0], "mapping": fallback.mapping,
            "hosts": restart.plan.hosts(),
            "mapping_from": fallback.source, "prepared_ahead": ready,
            "out": str(fallback.out), "detect_s": round(detected - t0, 3),
            "plan_s": round(planned - detected, 3), "deploy_s": round(shipped_at - planned, 3)})
        self._prepare_ahead()
        return restart

    def rebalance(self) -> Restart | None:
        """The original job on every host, deployed again (a check: only what changed moves)
        once every lost host answers; None when no host was lost. What the job these hosts
        were lost from may have left running there is ended first.

        Raises:
            AutodiceError: a lost host still does not answer (the running job goes on).
        """
        if not self.lost:
            return None
        shipped = ship(self.out_dir, self.inv, self.progress, self.keep_s)  # checks every host
        self._reap_stale(shipped)
        back = sorted(self.lost)
        self.lost.clear()
        restart = self._start(shipped)
        restart.incident.update({"rebalanced": back, "mapping": _mapping_of(self.out_dir),
                                 "hosts": restart.plan.hosts(),
                                 "mapping_from": "the original", "out": str(self.out_dir)})
        self._prepare_ahead()
        return restart

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every fallback prepared ahead is shipped (or failed); whether all were."""
        for future in list(self._ready.values()):
            if future.cancelled():  # not needed since (another loss came first)
                continue
            try:
                future.result(timeout)
            except Exception:  # noqa: BLE001 - a recovery prepares it again and says why
                return False
        return True

    def close(self) -> None:
        """No more fallbacks: the one being prepared finishes its step, the others never start."""
        self._closed.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ---- what was lost ---------------------------------------------------------------------

    def _find_lost(self, job: RemoteJob) -> tuple[set[str], list[str]]:
        """The hosts lost (silent ones, and those of the ranks that brought the job down), and
        the failure's lines; ``job`` is stopped, nothing of it left on the hosts that answer."""
        s = job.shipped
        answers = _answering(s)
        silent = {h.target.host for h in s.hosts if not answers[h.target.host]}
        if not silent:
            job.wait(2)  # a rank's death ends mpirun within a second: its word on it
        job.job.lose(silent)
        job.stop()
        code = job.poll()
        exits = rank_exits(s.ssh, [h for h in s.hosts if h.target.host not in silent])
        deaths = deaths_of(exits)
        output = job.log.read_text(errors="replace")
        hosts = {s.plan.ranks[k].host for k, _ in culprits(s.plan, output, deaths)}
        if not hosts:  # no marker says who died: mpirun may have ended a killed rank's wrapper
            hosts = vanished(s.plan, output, exits)
        lines = run_failure(s.plan, s.inv, output, -1 if code is None else code,
                            job.job.seconds, job.log, deaths)
        lines = [*(f"{s.inv.targets[h].where()}: does not answer over ssh" for h in sorted(silent)),
                 *lines]
        return hosts | silent, lines

    def _reap_stale(self, shipped: Shipped) -> None:
        """Hosts that come back may still run a rank of the job they were lost from (its link
        went down under it): end every program of ours there, the original's and fallbacks'."""
        back = [h for h in shipped.hosts if h.target.host in self.stale]
        if not back:
            return
        builds = [PROGRAM, *(Build(folder=_folder(lost)) for lost in self._ready)]
        builds += [Build(folder=_folder(frozenset(self.lost)))]
        for build in dict.fromkeys(builds):
            reap(shipped.ssh, back, "", build)
        self.stale.clear()

    # ---- fallbacks -------------------------------------------------------------------------

    def _prepare(self, lost: frozenset[str], force: bool = False) -> Fallback | None:
        """Split, generate and ship the job for the hosts left after ``lost``; None if the
        session closed first (unless ``force``: a recovery needs it now)."""
        with self._lock:
            if self._closed.is_set() and not force:
                return None
            mapping, source = self._mapping(lost)
            out = self.out_dir / "recovery" / _folder(lost)
            if not _holds(out, mapping):
                _split_gen(self.out_dir, self.plan, mapping, out)
            fallback = Fallback(out, self._inventory(lost), mapping, source)
            if force or self._closed.is_set():
                return fallback  # a recovery ships it itself
            ship(out, fallback.inventory, None, self.keep_s).close()
            return fallback

    def _mapping(self, lost: frozenset[str]) -> tuple[dict[str, list[str]], str]:
        """The fastest front point on the hosts left, else the original keys there, balanced."""
        left = [h for h in self.plan.hosts() if h not in lost]
        if self.front is not None:
            found = front_point(self.front, set(left), self.head)
            if found is not None:
                return found
        from ..core.model import load_model
        from ..frontend.suggest import balanced_mapping

        original = parse_mapping(self.out_dir / "mapping.json")
        keys = [k for k, r in original.resources.items() if r.host in left]
        graph = load_model(self.out_dir / self.plan.model,
                           {t.name: t.shape for t in self.plan.model_inputs})
        return (balanced_mapping(graph, keys, f"recovery without {', '.join(sorted(lost))}"),
                f"the original keys on {', '.join(left)}, balanced by FLOPs")

    def _inventory(self, lost: frozenset[str]) -> Inventory:
        """The hosts left, each in a folder of its own inside its remote directory (the original
        deployment stays whole), with the ncnn the first deploy used there."""
        folder = _folder(lost)
        targets = {name: replace(t, remote_dir=f"{t.remote_dir}/{folder}",
                                 ncnn_dir=self.ncnn.get(name, t.ncnn_dir))
                   for name, t in self.inv.targets.items() if name not in lost}
        return replace(self.inv, targets=targets)


def _folder(lost: frozenset[str]) -> str:
    return "without-" + "-".join(file_slug(h) for h in sorted(lost))


def _answering(s: Shipped) -> dict[str, bool]:
    """Host -> whether it runs ``true`` over its ssh connection within :data:`ANSWER_S`."""
    procs = {h.target.host: subprocess.Popen(s.ssh.cmd(h.target, "true"),
                                             stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL) for h in s.hosts}
    deadline = time.monotonic() + ANSWER_S
    answers = {}
    for name, p in procs.items():
        try:
            answers[name] = p.wait(max(0.0, deadline - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            answers[name] = False
    return answers


def read_front(front: Path) -> list[tuple[str, float, dict, list[str]]]:
    """A ``dse`` output's points, fastest first: (name, predicted frames/s, mapping, its keys'
    hosts in rank order). Read when the session opens, so a bad ``--front`` is said before
    anything is deployed, not at the loss it was meant for.

    Raises:
        AutodiceError: not a dse output, or a point or its mapping file is unreadable.
    """
    where = front / "pareto.json"
    try:
        doc = json.loads(where.read_text())
        points = [(str(p["point"]), float(p["throughput_fps"]), front / p["mapping"])
                  for p in doc["points"]]
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise AutodiceError(f"{where}: not a dse output ({type(e).__name__}: {e})") from None
    read = []
    for name, fps, path in sorted(points, key=lambda p: -p[1]):
        try:
            mapping = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise AutodiceError(f"{path}: point {name}'s mapping is unreadable ({e})") from None
        if not isinstance(mapping, dict):
            raise AutodiceError(f"{path}: point {name}'s mapping is not a JSON object")
        parsed = mapping_from(mapping, str(path))
        if parsed.bad_keys:
            key, why = next(iter(parsed.bad_keys.items()))
            raise AutodiceError(f'{path}: point {name}: key "{key}": {why}')
        read.append((name, fps, mapping, [parsed.resources[k].host for k, _ in parsed.entries]))
    return read


def front_point(front: Path, left: set[str], head: str) -> tuple[dict, str] | None:
    """The fastest point of a ``dse`` output whose keys are all on ``left`` with rank 0 on
    ``head`` (the input and the gateway stay where they are)."""
    for name, fps, mapping, hosts in read_front(front):
        if hosts and hosts[0] == head and set(hosts) <= left:
            return mapping, f"the DSE front's fastest point on {', '.join(sorted(left))} " \
                            f"({name}, {fps:.1f} frames/s predicted)"
    return None


def _mapping_of(out: Path) -> dict[str, list[str]]:
    return {k: list(v) for k, v in parse_mapping(out / "mapping.json").entries}


def _holds(out: Path, mapping: dict) -> bool:
    """Whether ``out`` is a generated output of ``mapping`` already, made after the original
    (a session before made it)."""
    try:
        load_plan(out)  # readable and whole
        return (out / "mapping.json").read_text() == mapping_json(mapping) \
            and _generated(out) > _generated(out.parent.parent)
    except (OSError, AutodiceError):
        return False


def _generated(out: Path) -> float:
    """When ``gen`` last wrote ``out``'s packages (a fallback older than its original is not
    one)."""
    return (out / "packages" / ".precision").stat().st_mtime


def _split_gen(out_dir: Path, plan: Plan, mapping: dict, out: Path) -> None:
    """``split`` and ``gen`` of ``mapping`` into ``out`` (inside OUT/recovery/)."""
    from ..backend.calibrate import KEYWORDS
    from ..backend.gen import gen
    from ..backend.precision import Precision
    from ..backend.wire import Wire
    from ..frontend.split import split

    claim(out_dir, "recovery/")
    out.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="autodice-recover-") as tmp:
        path = Path(tmp) / "mapping.json"
        path.write_text(mapping_json(mapping))
        split(out_dir / plan.model, path, out_dir / "platform.txt", out,
              {t.name: t.shape for t in plan.model_inputs})
    precision = Precision.of_output(out_dir)
    try:  # int8 ranks: calibrated as before
        calibration = json.loads((out_dir / "packages" / ".calibration").read_text())
    except (OSError, ValueError):
        calibration = {}
    # Layers named by hand may now sit in fp32 keys (gen refuses a name no int8 key has): the
    # new plan keeps the rules (first, last, sensitive), measured anew.
    keep = [k for k in calibration.get("keep_fp32") or () if k in KEYWORDS] or None
    gen(out, precision=precision, calibration=calibration.get("source"),
        preprocess=calibration.get("preprocess"), keep_fp32=keep,
        wire=Wire.of_output(out_dir).kind)  # the edges that cross hosts now: as asked before

