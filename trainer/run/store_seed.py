"""A new local MLflow store starts as a copy of an empty one whose schema migrations already ran.

MLflow makes a SQLite store by running every schema migration, about 1.5 s of CPU on an idle core and 5 s under
load, for each new sweep, each `hdrope train --tracking-uri sqlite:///...` and each `mlflow server` on a new file.
The first store made with an MLflow version is kept, empty, in the lab's cache (`trainer.files.cache.cache_root`:
$HDROPE_CACHE, else ~/.cache/hdrope) as `mlflow-store/<version>.db`, and a new store is a copy of it (about 0.1 s).
The copy holds no experiment: MLflow creates its default experiment, with the new store's own artifact root, the
first time it opens it. An existing store is never touched; where the cache cannot be written, MLflow makes the store
itself, as before.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

__all__ = ["seed_store", "store_template"]


def _sqlite_path(uri: str) -> Path | None:
    """The file of a `sqlite:///PATH` store URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def store_template() -> Path | None:
    """The cached empty, migrated store of this MLflow version, made on first use (None if it cannot be made)."""
    import mlflow

    from trainer.files.cache import cache_root

    try:
        folder = cache_root() / "mlflow-store"
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    final = folder / f"{mlflow.__version__}.db"
    if final.is_file():
        return final
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        db = work / "store.db"
        store = SqlAlchemyStore(f"sqlite:///{db}", str(work / "artifacts"))  # runs every migration
        store.engine.dispose()
        with sqlite3.connect(db) as con:  # empty: the copy's default experiment gets the copy's own artifact root
            con.execute("DELETE FROM experiment_tags")
            con.execute("DELETE FROM experiments")
        con.close()
        os.replace(db, final)  # atomic: a reader sees the whole template or none
    except (OSError, sqlite3.Error):
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def seed_store(uri: str) -> bool:
    """When `uri` is a SQLite store whose file does not exist yet, create it as a copy of `store_template`;
    True if it did (False for any other store, one that exists, or no template)."""
    db = _sqlite_path(uri)
    if db is None or db.exists():
        return False
    template = store_template()
    if template is None:
        return False
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{db.name}-", dir=db.parent)
        os.close(fd)
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, db)  # atomic, and never replaces a store another process made meanwhile
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
    except OSError:
        return False
    return True
