"""Which rank brought a failed MPI job down, read from the evidence the job left behind.

``autodice run`` (every rank on this machine) and ``autodice deploy --run`` (ranks across hosts)
fail the same ways, so one reading serves both. Evidence, strongest first:

1. Death markers (deploy's rank wrapper writes one with the time and exit code when its rank
   ends; those of a signal death count here, but not the TERM with which mpirun aborts a job):
   the rank that died *first* is the culprit, not the peers that then lost their connection to it.
2. mpirun's notice that a process exited on a signal.
3. The ranks' watchdog lines: a rank that waits longer than ``AUTODICE_TIMEOUT_S`` says what it
   waited for and from which rank, and ends the job after a grace second so that every waiting
   rank gets to say so. The culprit is the peer that was not itself waiting.

Each caller names a rank its own way (deploy by its host's ssh address) and adds its own context
around these lines (what the ranks said last, where the log is).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterable

from ..core.plan import Plan

Death = tuple[float, int, int]  # (time, rank, exit code) from a rank's death marker

_KILLED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)"
                     r"(?: \(([^)]*)\))?")
_TIMED_OUT = re.compile(r"^\[rank (\d+) [^]]*\] timed out .* waiting to (?:recv|send) "
                        r"\"([^\"]*)\" (?:from|to) rank (\d+)")


def explain_failure(plan: Plan, output: str, deaths: Iterable[Death] = (),
                    name: Callable[[int], str] | None = None) -> list[str]:
    """One line for each rank that brought the job down, from the strongest evidence there is.

    Args:
        output: what mpirun and the ranks printed.
        deaths: the ranks' death markers, if the job left any.
        name: how a line names rank ``k``; by default ``rank k (KEY on HOST)``.
    Returns:
        ``NAME died: killed by signal N (WHICH)`` for the rank that died first (markers) or each
        rank mpirun saw die, else ``NAME stopped responding (rank j for "TENSOR" waited in
        vain)`` for each rank that others waited on in vain; empty when nothing names a rank.
    """
    def local_name(k: int) -> str:
        return f"rank {k} ({plan.ranks[k].key} on {plan.ranks[k].host})"

    name = name or local_name
    return [f"{name(k)} {what}" for k, what in culprits(plan, output, deaths)]


def culprits(plan: Plan, output: str, deaths: Iterable[Death] = ()) -> list[tuple[int, str]]:
    """(rank, what happened to it) for each rank that brought the job down (see
    :func:`explain_failure`); what a recovery counts as lost."""
    known = range(len(plan.ranks))
    died = sorted(d for d in deaths if d[1] in known)
    if died:
        _, k, code = died[0]
        return [(k, f"died: killed by {_signal_name(code)}")]
    text = " ".join(output.replace("\0", "").split())
    killed = [(int(m[1]), f"died: killed by signal {m[2]}" + (f" ({m[3]})" if m[3] else ""))
              for m in _KILLED.finditer(text) if int(m[1]) in known]
    return killed or _stopped_responding(output, known)


def _stopped_responding(output: str, known: range) -> list[tuple[int, str]]:
    """The ranks that others waited on in vain while they themselves waited on no one."""
    waits = {}
    for ln in output.splitlines():
        # A rank frozen through its own wait (SIGSTOP, then mpirun's SIGCONT at the abort)
        # times out too, but it is the culprit: it says so, and does not count as waiting.
        if (m := _TIMED_OUT.match(ln)) and "this rank was frozen" not in ln:
            waits[int(m[1])] = (m[2], int(m[3]))
    found = []
    for stuck in sorted({peer for _, peer in waits.values()} - set(waits)):
        if stuck in known:
            waiting = [f'rank {k} for "{t}"' for k, (t, p) in sorted(waits.items()) if p == stuck]
            found.append((stuck, f"stopped responding ({', '.join(waiting)} waited in vain)"))
    return found


def _signal_name(code: int) -> str:
    """``signal 9 (SIGKILL)`` for a shell's exit code 137; the code itself if it is no signal."""
    try:
        return f"signal {code - 128} ({signal.Signals(code - 128).name})"
    except ValueError:
        return f"exit code {code}"


_RULE = "-" * 20


def without_notices(lines: list[str]) -> list[str]:
    """``lines`` less Open MPI's boxed notices that tell nothing of a failure (the deprecation
    of ``--rankfile``, which 5.x prints at every start and which must stay the spelling 4.x
    boards understand): a box between two rules that opens with ``WARNING: A deprecated``."""
    kept, box = [], None
    for line in lines:
        if box is None and line.startswith(_RULE):
            box = [line]
        elif box is not None:
            box.append(line)
            if line.startswith(_RULE):
                if not any("deprecated" in b for b in box[1:3]):
                    kept.extend(box)
                box = None
        else:
            kept.append(line)
    return kept + (box or [])
