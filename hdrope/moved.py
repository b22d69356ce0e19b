"""Modules that moved: importing an old name fails at once with a message that names the new home.

A package registers its table once (`register({"trainer.loop": "trainer.run.loop"})`); the finder sits at the end
of `sys.meta_path`, so it is asked only after every real finder found nothing and never shadows a module that
exists. Old names are not aliased to the new modules: one module, one name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "lazy_exports", "moved_attribute_error", "register"]

MOVED: dict[str, str] = {}  # old dotted module name -> its new home


def _message(old: str) -> str:
    return f"{old} moved to {MOVED[old]}: import {MOVED[old]} instead"


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Raises ModuleNotFoundError naming the new home for a registered old module name."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname in MOVED:
            raise ModuleNotFoundError(_message(fullname), name=fullname)
        return None


_FINDER = _MovedFinder()


def register(table: dict[str, str]) -> None:
    """Record old -> new module names and make sure the finder is installed (once)."""
    MOVED.update(table)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def moved_attribute_error(package: str, name: str) -> AttributeError:
    """The AttributeError for `package.name`, naming the new home when `package.name` is a moved module."""
    old = f"{package}.{name}"
    hint = f": {_message(old)}" if old in MOVED else ""
    return AttributeError(f"module {package!r} has no attribute {name!r}{hint}")


def lazy_exports(package: str, exports: dict[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module `__getattr__` and `__dir__` (PEP 562) for its public names: `exports` maps each name to
    the submodule defining it, imported on first use and then cached in `namespace` (the package's globals()); any
    other name is an AttributeError that names the new home of a moved module."""

    def getattr_(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value
            return value
        raise moved_attribute_error(package, name)

    def dir_() -> list[str]:
        return sorted([*namespace, *exports])

    return getattr_, dir_
