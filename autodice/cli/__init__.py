"""The ``autodice`` command: each verb parses options, calls one library function, prints.

One module per stage (``frontend``, ``backend``, ``dse``, ``deploy``) registers its verbs on the
group in ``app``; importing this package registers them all.
"""

from . import backend, deploy, dse, frontend  # noqa: F401  (they register their verbs)
from .app import main

__all__ = ["main"]
