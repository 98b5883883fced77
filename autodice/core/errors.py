"""The one error type users see.

Every check collects *all* offenders before failing, so a user fixes a mapping in one pass
instead of one error per run. The CLI turns an :class:`AutodiceError` into one line per problem
and exit code 2; library callers get the list in ``.problems``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class AutodiceError(Exception):
    """Bad input or an unusable environment: each problem is one line naming file, key, node."""

    def __init__(self, *problems: str):
        self.problems = [p for p in problems if p]
        super().__init__("\n".join(self.problems))


class Problems:
    """Collects problems so a pass can report every offender at once, then fail."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise AutodiceError(*self.items)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean "x"?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


def read_text(path: str | Path) -> str:
    """The text of a file the user named; one line naming the file when it cannot be read.

    Raises:
        AutodiceError: ``PATH: cannot read (REASON)``.
    """
    try:
        return Path(path).read_text()
    except OSError as e:
        raise AutodiceError(f"{path}: cannot read ({e.strerror})") from None
