"""The one user-error type of the lab.

`UserError` is raised on purpose for a mistake in what a person gave: a flag, a config or spec
key, a file. Its message names the field, the bad value and the fix. The `hdrope` console catches
it alone and exits with code 2; every other exception is a bug and keeps its traceback.
It is not a ValueError: a handler for user errors names UserError, so a ValueError from a bug is never
mistaken for one.
"""

from __future__ import annotations

__all__ = ["UserError", "one_line"]


class UserError(Exception):
    """A bad input from the user; the message says the field, the value and the fix."""


def one_line(err: BaseException) -> str:
    """The error's message on one line, as the console prints a UserError: a message that lists several problems
    on indented lines under a header ("invalid config:\n  a\n  b") becomes "invalid config: (1) a (2) b"."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return " ".join([lines[0], *(f"({i}) {line}" for i, line in enumerate(lines[1:], 1))])
    return " ".join(lines)
