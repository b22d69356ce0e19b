"""Never write into a directory that holds someone else's files: `refuse_foreign` names what is there.

The lab's writers of whole directories (`hdrope data prepare`, `hdrope passkey build`, `hdrope train`) each accept a
new directory, an empty one, or one holding only what they write themselves; anything else may be the user's own
files, which a write would replace, so it is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hdrope.errors import UserError

__all__ = ["refuse_foreign"]


def refuse_foreign(directory: Path, where: str, writer: str, ours: Callable[[Path], bool], why: str = "",
                   fix: str = "give a new or empty directory") -> None:
    """UserError when `directory` holds an entry that `ours` does not claim: the message names the directory as
    `where` gives it (e.g. "--out runs/x"), the first foreign entry and how many more, that `writer` did not write
    them (`why`, e.g. what marks the writer's own directories, in brackets), and `fix`."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    foreign = sorted(p.name for p in directory.iterdir() if not ours(p))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserError(f"{where}: holds {foreign[0]!r}{more}, which `{writer}` did not write{why}; {fix}")
