"""The one user-error type of the lab.

`UserError` is raised on purpose for a mistake in what a person gave: a flag, a config or spec
key, a file. Its message names the field, the bad value and the fix. The `hdrope` console catches
it alone and exits with code 2; every other exception is a bug and keeps its traceback.
It subclasses ValueError, so library callers that catch ValueError keep working.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(ValueError):
    """A bad input from the user; the message says the field, the value and the fix."""
