"""Processes that end with the autodice process that started them, however it ends.

A job (mpirun here, or the ssh that runs mpirun on a head node) is stopped in order by the code
that started it, but no code runs when that process is killed by SIGKILL, or dies in a way
Python never sees: mpirun and its ranks were then reparented to init and went on computing,
holding their shared memory. So every job process is started with Linux's parent-death signal
(``PR_SET_PDEATHSIG``): the kernel sends it SIGTERM the moment its parent goes, and mpirun ends
its ranks on SIGTERM as on a stop (an ssh that dies so closes its connection, and the launch
script on the head, which watches its stdin, ends mpirun there: ``deploy/launch.py``).

The kernel ties that signal to the *thread* that forked the child, not to the process: a job
started from a thread that later ends (a worker that opened a session) would be killed under a
process that still runs. So jobs are forked by one thread that lives as long as the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

_PR_SET_PDEATHSIG = 1
_lock = threading.Lock()
_forker: ThreadPoolExecutor | None = None


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:  # not glibc-like: no parent-death signal, jobs are stopped as before
        return None


_LIBC = _libc()


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGTERM when the forking thread ends; at once if the parent
    is already gone (it died between the fork and here)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def spawn(argv: list[str], **options) -> subprocess.Popen:
    """``subprocess.Popen(argv, **options)``, the child sent SIGTERM when this process ends.

    Raises:
        OSError: as Popen does (the program cannot be started).
    """
    global _forker
    with _lock:
        if _forker is None:
            _forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autodice-forker")
    parent = os.getpid()
    return _forker.submit(subprocess.Popen, argv, preexec_fn=lambda: _die_with_parent(parent),
                          **options).result()
