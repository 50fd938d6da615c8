"""The one target loader: ``impl``, ``spec``, a component's extra built-in names, ``mutant:NAME``,
``MOD:CLASS`` or ``FILE.py:CLASS``.

A target only needs the upstream API and attribute names (docs/), so the same loader serves
kvspec's impl, a planted-bug subclass and an engine team's own checkout. What a component's target
must offer is its registry record's ``required_api``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvspec import components


class TargetError(Exception):
    """The target cannot be loaded or lacks the API (the CLI exits 2 with this one-line reason)."""


def _load_file(path: Path, class_name: str) -> Any:
    """Import ``path`` as a module of a synthetic package over its folder.

    Sibling modules then resolve both as ``from .prefix_cache import …`` and as ``import
    prefix_cache``, without executing the folder's ``__init__.py`` (an engine's package init may
    load native GPU libraries; InfiniLM's CPU tests avoid it the same way).
    """
    if not path.is_file():
        raise TargetError(f"target file {path} does not exist")
    folder = path.resolve().parent
    package_name = f"kvspec_target_{abs(hash(str(folder))):x}"
    package = sys.modules.get(package_name)
    if package is None:
        package = types.ModuleType(package_name)
        package.__path__ = [str(folder)]
        sys.modules[package_name] = package
    module_name = f"{package_name}.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a syntax error or a crash at import is "could not run", not a bug
        raise TargetError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(folder))
    return getattr(module, class_name, None)


def load_target(component_name: str, target: str | None) -> tuple[str, Callable[..., Any]]:
    """Resolve ``target`` for ``component_name`` into (label, class). Raises TargetError."""
    try:
        comp = components.get(component_name)
    except components.ComponentError as exc:
        raise TargetError(str(exc)) from None
    label = target or "impl"
    ref = comp.builtin_targets().get(label, label)
    if ref.startswith("mutant:"):
        planted = {m.name: m for m in comp.planted}
        mutant = planted.get(ref.removeprefix("mutant:"))
        if mutant is None:
            raise TargetError(f"no mutant {ref!r} for {comp.name} (known: {', '.join(planted)})")
        cls: Any = mutant.cls
    else:
        where, sep, class_name = ref.rpartition(":")
        if not sep or not where or not class_name:
            raise TargetError(
                f"target {ref!r} must be impl, spec, mutant:NAME, MOD:CLASS or FILE.py:CLASS"
            )
        if where.endswith(".py"):
            cls = _load_file(Path(where), class_name)
        else:
            try:
                cls = getattr(importlib.import_module(where), class_name, None)
            except ImportError as exc:
                raise TargetError(f"cannot import module {where!r}: {exc}") from exc
        if cls is None:
            raise TargetError(f"{where} has no attribute {class_name!r}")
    missing = [m for m in comp.required_api if not callable(getattr(cls, m, None))]
    if missing:
        raise TargetError(f"{label} lacks the {comp.name} API: missing {', '.join(missing)}")
    return label, cls
