"""SIGINT, SIGTERM and SIGHUP: a stop, raised where the main thread is, or held for a step that
must not be cut in two.

The CLI handles all three with :func:`on_stop`: Ctrl-C raises KeyboardInterrupt as Python's own
handler does, SIGTERM and SIGHUP raise :class:`~autodice.core.errors.Stopped`, and every path
that stops cleanly on Ctrl-C does so on them too. Python runs a handler in the main thread at
whatever bytecode it is at; a session that has taken a result off its socket and not yet
counted it would then be out of step with its job, and its drain would wait for a result that
never comes (once in a few CI runs, ``autodice run`` hung on SIGINT that way). Inside
:func:`stops_held` a stop is held and raised as the block ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import Stopped

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_held = 0  # depth of stops_held() in the main thread
_pending: list[int] = []  # the signals that came while held, first first


def stop_for(signum: int) -> KeyboardInterrupt:
    """What a stop by ``signum`` raises: KeyboardInterrupt for Ctrl-C, else Stopped."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


def on_stop(signum: int, frame) -> None:
    """The handler of :data:`SIGNALS` (main thread): raise the stop, or hold it."""
    if _held:
        _pending.append(signum)
        return
    raise stop_for(signum)


@contextmanager
def stops_held() -> Iterator[None]:
    """Hold stops until the block ends, then raise the first (in the main thread; elsewhere no
    signal handler runs, and this does nothing). Keep the block short and bounded: a stop
    waits for it."""
    global _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending:
            signum = _pending[0]
            _pending.clear()
            raise stop_for(signum)
