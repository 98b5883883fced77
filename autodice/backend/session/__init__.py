"""The session room: a job started once and fed frame by frame, results in order.

``session.py`` is the :class:`Session` itself; ``feed.py`` what goes in (the caller's numbers
checked, the feeder thread); ``gateway.py`` the wire to the job's gateway rank; ``job.py`` the
contract with whoever starts the job (here: ``backend/run.py``; on hosts: ``deploy/``);
``frames.py`` where frames come from (a batch, images, stdin); ``frame_copy.py`` the checked copy
into shared memory; ``figures.py`` what a session measures; ``results.py`` a stream's results
into one folder (``autodice run --input``).
"""

from .feed import check_count, check_window
from .gateway import FrameError
from .job import Recovery, Restart, SessionError
from .session import Session

__all__ = ["FrameError", "Recovery", "Restart", "Session", "SessionError", "check_count",
           "check_window"]
