"""What every example does with a refusal: the user's to fix, so its lines and exit code 2, as
the ``autodice`` command does, no traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

import autodice


def run(main: Callable[[], int]) -> None:
    """``sys.exit(main())``, an AutodiceError as ``error:`` lines on stderr and exit code 2."""
    try:
        sys.exit(main())
    except autodice.AutodiceError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
