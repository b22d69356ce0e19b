"""The one user-error type of the lab.

`UserError` is raised on purpose for a mistake in what a person gave: a flag, a config or spec
key, a file. Its message names the field, the bad value and the fix. The `hdrope` console catches
it alone and exits with code 2; every other exception is a bug and keeps its traceback.
It is not a ValueError: a handler for user errors names UserError, so a ValueError from a bug is never
mistaken for one.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A bad input from the user; the message says the field, the value and the fix."""
