"""A directory that keeps its own MLflow store (a sweep: DIR/mlflow.db, artifacts in DIR/artifacts) stays whole when
it is copied or moved: `rehome_store` points the store's records at the directory where it is now.

MLflow records absolute locations: each experiment's artifact folder and each run's artifact folder under it (and the
lab's `final_checkpoint` tag holds a checkpoint's path). A copy of the directory keeps the original's, so logging a
report into the copy would write into the original, or recreate it once it has been moved away. On open, every
location that lies under the directory where the store was made (the parent of a lab-made artifact folder,
`artifacts` or `mlartifacts`, not the directory it is in now) is rewritten to the same place under its new home.
The rewrite is an SQL update of MLflow's own tables (`experiments.artifact_location`, `runs.artifact_uri`,
`tags.value`), since MLflow has no call that moves them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["ARTIFACT_FOLDERS", "rehome_store"]

ARTIFACT_FOLDERS = ("artifacts", "mlartifacts")  # where `trainer.run.tracking.experiment` puts a local store's files


def _path(location: str) -> Path | None:
    """The local path of a file: URI or absolute path, else None (a remote store)."""
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    return Path(location) if location.startswith("/") else None


def rehome_store(uri: str, home: Path) -> int:
    """When `uri` is `home`'s own store (sqlite:///HOME/mlflow.db) and its records point under another directory
    (home was copied or moved since), rewrite them to the same places under `home`; the number of records changed
    (0 for any other store, or one already at home)."""
    home = Path(home).resolve()
    db = home / "mlflow.db"
    if not uri.startswith("sqlite:///") or not db.is_file() or Path(uri.removeprefix("sqlite:///")).resolve() != db:
        return 0
    changed = 0
    con = sqlite3.connect(db, timeout=60)
    try:
        with con:  # one transaction: a store is rewritten whole or not at all
            for exp_id, location in con.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall():
                path = _path(location or "")
                if path is None or path.name not in ARTIFACT_FOLDERS or path.parent == home:
                    continue
                old, new = path.parent, home
                changed += _rewrite(con, location, (home / path.name).as_uri(), old, new, exp_id)
    finally:
        con.close()
    return changed


def _rewrite(con: sqlite3.Connection, old_location: str, new_location: str, old: Path, new: Path,
             exp_id: int) -> int:
    """Rewrite one experiment's artifact location, its runs' artifact URIs and their tags that name paths under
    `old`; the number of rows changed."""
    n = con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
                    (new_location, exp_id)).rowcount
    prefix = old_location.rstrip("/") + "/"
    n += con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) WHERE experiment_id = ? AND "
                     "substr(artifact_uri, 1, ?) = ?",
                     (new_location.rstrip("/") + "/", len(prefix) + 1, exp_id, len(prefix), prefix)).rowcount
    at = str(old) + "/"
    n += con.execute("UPDATE tags SET value = ? || substr(value, ?) WHERE substr(value, 1, ?) = ? AND run_uuid IN "
                     "(SELECT run_uuid FROM runs WHERE experiment_id = ?)",
                     (str(new) + "/", len(at) + 1, len(at), at, exp_id)).rowcount
    return n
