"""What each rank leaves when it ends: a marker with the time and its exit code.

Every rank of a deployed job runs under :data:`WRAPPER`, so that after a failure the report names
the rank that died of a signal (killed, out of memory, crashed) first rather than the peers that
then lost their connection to it, and a job whose mpirun hung (``launch.MPIRUN_HUNG``) still says
how every rank ended. :func:`run_failure` is that report: the rank that failed first, from the
markers and what the job printed.
"""

from __future__ import annotations

import re
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from ..backend.failure import Death, explain_failure, without_notices
from ..core.plan import Plan
from .inventory import Inventory
from .ssh import Host, Ssh

# mpirun aborts a job with TERM to each rank's process group, which may come the moment this
# rank was killed: the trap is set before the rank starts (a caught signal is reset on exec, so
# the rank still dies of TERM) and this shell lives on to write the marker, with "aborted" when
# that TERM reached it: a rank that died of the job's abort is not a culprit. Between the rank's
# end and the marker only builtins run: a command forked there (the marker's time once came
# from `date`) is in the group and dies of that TERM, and its marker with it. The marker's
# modification time is when the rank ended. $1 marker, then the command.
WRAPPER = r"""
marker=$1; shift
aborted=
trap 'aborted=" aborted"' TERM
"$@"
code=$?
echo "$code$aborted" > "$marker"
exit "$code"
"""
# Prints "rank time code [aborted]" for each marker in $1/results (time: the marker's mtime).
EXITS = r"""
for f in "$1"/results/exit-*; do
  [ -f "$f" ] && echo "${f##*/exit-} $(date -r "$f" +%s.%N) $(cat "$f")"
done
exit 0
"""


class RankExit(NamedTuple):
    """A rank's end, from the marker its wrapper left."""

    time: float
    rank: int
    code: int
    aborted: bool  # mpirun's TERM (its abort of the job) reached the wrapper


def rank_deaths(ssh: Ssh, hosts: list[Host]) -> list[Death]:
    """(time, rank, exit code) of every rank that died of a signal, earliest first; not those
    that died of the TERM mpirun ends a failed job with."""
    return deaths_of(rank_exits(ssh, hosts))


def deaths_of(exits: list[RankExit]) -> list[Death]:
    """:func:`rank_deaths` of markers already read."""
    return [(e.time, e.rank, e.code) for e in exits
            if e.code > 128 and not (e.aborted and e.code == 128 + signal.SIGTERM)]


# Open MPI's word when a peer's connection drops: "Peer host:  edge01".
_PEER_HOST = re.compile(r"Peer host:\s+(\S+)")


def vanished(plan: Plan, output: str, exits: list[RankExit]) -> set[str]:
    """The hosts Open MPI says a peer vanished from and whose ranks left no marker at all: a
    killed rank's wrapper may itself be killed before it writes one (mpirun's KILL follows its
    TERM when the wrapper is slow to end), while every rank that merely lost its peer leaves
    one."""
    marked = {plan.ranks[e.rank].host for e in exits if 0 <= e.rank < len(plan.ranks)}
    ours = {r.host for r in plan.ranks}
    return (set(_PEER_HOST.findall(output)) & ours) - marked


def parse_exits(said: str) -> list[RankExit]:
    """The markers in what :data:`EXITS` printed on one host (a line it could not read, none)."""
    found = []
    for line in said.splitlines():
        parts = line.split()
        try:
            found.append(RankExit(float(parts[1]), int(parts[0]), int(parts[2]),
                                  parts[3:] == ["aborted"]))
        except (IndexError, ValueError):
            continue
    return found


def rank_exits(ssh: Ssh, hosts: list[Host]) -> list[RankExit]:
    """Every rank that has ended, earliest first (the markers the rank wrapper leaves in each
    host's results folder)."""
    found: list[RankExit] = []

    def read(h: Host) -> None:
        proc = subprocess.run(ssh.script(h.target, EXITS, h.dir), capture_output=True,
                              text=True, timeout=60)
        found.extend(parse_exits(proc.stdout))

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(read, hosts))
    return sorted(found)


_RANK_SAYS = re.compile(r"^\[rank (\d+) ([^\]]*)\] (.*)")
_FIRST = re.compile(r"Process name: \[\S+,(\d+)\] Exit code: (\d+)")


def run_failure(plan: Plan, inv: Inventory, output: str, code: int, seconds: float,
                log: Path, deaths: list[Death] = ()) -> list[str]:
    """One line naming the rank that failed first, its key and host, then what ranks said.

    The rank comes from :func:`~autodice.backend.failure.explain_failure` (the rank wrappers'
    markers, mpirun's notice of a death, the ranks' watchdogs). When that names none: the first
    thing a rank said, else Open MPI's first failed process, else mpirun's last lines.
    """
    def name(rank: int) -> str:
        r = plan.ranks[rank]
        return f"{inv.targets[r.host].where()}: run: rank {r.rank} ({r.key})"

    lines = explain_failure(plan, output, deaths, name)
    said = []
    for line in output.splitlines():
        m = _RANK_SAYS.match(line)
        if m and int(m.group(1)) < len(plan.ranks):
            r = plan.ranks[int(m.group(1))]
            said.append(f"rank {r.rank} ({r.key}) on host {r.host}: {m.group(3)}")
    if not lines and said:
        lines.append(f"run: the job failed (exit {code}); {said[0]}")
        said = said[1:]
    flat = " ".join(output.replace("\0", "").split())
    if not lines and (m := _FIRST.search(flat)) and int(m.group(1)) < len(plan.ranks):
        lines.append(f"{name(int(m.group(1)))} failed first (exit code {m.group(2)})")
    if not lines:
        tail = [ln for ln in without_notices(output.strip().splitlines())
                if ln.strip() and "setpgid" not in ln]
        lines.append(f"run: mpirun failed (exit {code})")
        said = tail[-8:]
    return [*lines, *said[:5], f"after {seconds:.1f} s; full log: {log}"]
