"""The one target loader: ``impl``, ``spec``, ``mutant:NAME``, ``MOD:CLASS`` or ``FILE.py:CLASS``.

A target only needs the upstream API and attribute names (shared/reference/), so the same loader
serves kvspec's impl, a planted-bug subclass and an engine team's own checkout.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TargetError(Exception):
    """The target cannot be loaded or lacks the API (the CLI exits 2 with this one-line reason)."""


@dataclass(frozen=True)
class Component:
    name: str
    builtin: dict[str, str]  # short name -> MOD:CLASS
    required_api: tuple[str, ...]


COMPONENTS: dict[str, Component] = {
    "infinilm-block-manager": Component(
        "infinilm-block-manager",
        {
            "impl": "impl.infinilm.block_manager:BlockManager",
            "spec": "spec.infinilm.block_manager:BlockManager",
        },
        (
            "allocate_slots",
            "get_computed_blocks",
            "append_slot",
            "append_slots",
            "truncate_blocks",
            "publish_computed_blocks",
            "free_blocks",
            "try_free_blocks",
            "can_allocate",
            "get_num_free_blocks",
            "get_total_usable_blocks",
            "update_blocks_slot",
        ),
    ),
    "infinilm-scheduler": Component(
        "infinilm-scheduler",
        {
            "impl": "impl.infinilm.scheduler:Scheduler",
            "spec": "spec.infinilm.scheduler:Scheduler",
        },
        (
            "add_request",
            "schedule",
            "can_accept_request",
            "complete_requests",
            "commit_computed_tokens",
            "update_from_output",
            "update_waiting_for_remote_kv",
            "get_cache_stats",
        ),
    ),
    **{
        name: Component(
            name,
            {
                "impl": "impl.vllm.offload_manager:CPUOffloadingManager",
                "spec": "spec.vllm.offload_manager:CPUOffloadingManager",
                # resolved lazily: a one-line TargetError when vllm cannot be imported
                "vllm": "kvspec.vllm_adapter:VllmCPUOffloadingManager",
            },
            (
                "lookup",
                "prepare_load",
                "complete_load",
                "prepare_store",
                "complete_store",
                "touch",
                "reset_cache",
                "take_events",
            ),
        )
        for name in ("vllm-arc", "vllm-lru")
    },
}


def component(name: str) -> Component:
    try:
        return COMPONENTS[name]
    except KeyError:
        known = ", ".join(sorted(COMPONENTS))
        raise TargetError(
            f"unknown or not yet built component {name!r} (available: {known})"
        ) from None


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
    comp = component(component_name)
    label = target or "impl"
    ref = comp.builtin.get(label, label)
    if ref.startswith("mutant:"):
        from stateful_tests.mutants import CATALOGUE

        mutant = CATALOGUE.get(ref.removeprefix("mutant:"))
        if mutant is None or mutant.component != comp.name:
            names = ", ".join(n for n, m in CATALOGUE.items() if m.component == comp.name)
            raise TargetError(f"no mutant {ref!r} for {comp.name} (known: {names})")
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
