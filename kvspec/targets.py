"""The one target loader: ``impl``, ``spec``, a component's extra built-in names, ``mutant:NAME``,
``MOD:CLASS``, ``FILE.py:CLASS``, or an engine at a source: ``ENGINE@SOURCE`` (``vllm@git:../vllm@main``,
``sglang@/tmp/sglang-0.5.23-….whl``, ``infinilm@/tmp/tree``) or a bare ``SOURCE`` (the component's
own engine), imported under its own module namespace (:mod:`kvspec.engines.trees`).

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


def _engine_source(comp: components.Component, text: str) -> tuple[str, str] | None:
    """``(engine target name, source)`` when ``text`` names an engine at a source."""
    from kvspec.engines import trees

    name, sep, source = text.partition("@")
    if sep and name in comp.targets and name.partition("-")[0] in trees.ENGINES:
        return name, source
    if sep and name.partition("-")[0] in trees.ENGINES and trees.is_source(source):
        known = ", ".join(n for n in comp.targets) or "none"
        raise TargetError(f"{comp.name} has no {name} target (its engine targets: {known})")
    if trees.is_source(text):
        if comp.engine is None:
            raise TargetError(f"{comp.name} models no engine: a source such as {text!r} needs one")
        return comp.engine, text
    return None


def _load_from_source(comp: components.Component, name: str, source: str) -> Any:
    """The engine target ``name`` of ``comp`` over the engine tree at ``source``."""
    from kvspec.engines import trees

    engine = name.partition("-")[0]
    try:
        ns = trees.source_namespace(engine, source)
    except trees.TreeError as exc:
        raise TargetError(str(exc)) from None
    where, _, class_name = comp.targets[name].rpartition(":")
    if where.startswith("kvspec."):  # an adapter: it imports the engine from the namespace
        return importlib.import_module(where).target_class(class_name, ns)
    try:
        module = ns.import_module(where)
    except Exception as exc:  # a syntax error or a missing dependency in the tree
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise TargetError(f"importing {where} from {source} failed: {reason}") from exc
    return getattr(module, class_name, None)


def load_target(component_name: str, target: str | None) -> tuple[str, Callable[..., Any]]:
    """Resolve ``target`` for ``component_name`` into (label, class). Raises TargetError."""
    try:
        comp = components.get(component_name)
    except components.ComponentError as exc:
        raise TargetError(str(exc)) from None
    label = target or "impl"
    ref = comp.builtin_targets().get(label, label)
    at_source = _engine_source(comp, label)
    if at_source is not None:
        cls: Any = _load_from_source(comp, *at_source)
        if cls is None:
            raise TargetError(f"{label}: the tree has no {comp.targets[at_source[0]]}")
    elif ref.startswith("mutant:"):
        planted = {m.name: m for m in comp.planted}
        mutant = planted.get(ref.removeprefix("mutant:"))
        if mutant is None:
            raise TargetError(f"no mutant {ref!r} for {comp.name} (known: {', '.join(planted)})")
        cls = mutant.cls
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


def load_reference(
    component_name: str, oracle: str | None, baseline: str | None, target_label: str
) -> Any:
    """The reference of a run from ``--oracle`` and ``--baseline`` (a
    :class:`stateful_tests.checker.Reference`). ``--baseline`` alone means ``--oracle baseline``;
    the baseline is loaded like a target and must offer the component's API."""
    from stateful_tests.checker import ORACLES, SPEC, Reference

    kind = oracle or ("baseline" if baseline else "spec")
    if kind not in ORACLES:
        raise TargetError(f"unknown --oracle {kind!r}; choose one of {', '.join(ORACLES)}")
    if kind == "baseline" and not baseline:
        raise TargetError("--oracle baseline needs --baseline TARGET (the previous revision)")
    if kind != "baseline" and baseline:
        raise TargetError(
            f"--baseline compares against the baseline: it contradicts --oracle {kind}"
        )
    if kind == "spec":
        return SPEC
    if kind == "invariants":
        return Reference("invariants", label=f"copy of {target_label}")
    try:
        label, cls = load_target(component_name, baseline)
    except TargetError as exc:
        raise TargetError(f"--baseline {baseline}: {exc}") from None
    return Reference("baseline", cls, label)


def resolve_variant(
    comp: components.Component,
    variant: str | None,
    cls: Any,
    reference: Any,
    note: Callable[[str], None] | None = None,
) -> str | None:
    """The variant a run drives: ``--variant``, else the target's own (``kvspec_variant``).

    A target whose version no variant models (``kvspec_unknown``, e.g. vLLM 0.34.0 or an
    unreleased revision) is never silently checked as another release: against the spec it is a
    ``TargetError`` naming the nearest modelled variant and what runs instead; against a
    baseline or its invariants it runs, driven as the baseline's variant or the nearest one, and
    ``note`` is told so."""
    unknown = getattr(cls, "kvspec_unknown", None)
    if variant is not None or not unknown:
        return comp.target_variant(variant, cls)
    nearest = getattr(cls, "kvspec_nearest", None)
    kind = getattr(reference, "kind", "spec")
    if kind == "spec":
        raise TargetError(
            f"{unknown}: check it against the previous revision (--baseline OLD), by its "
            f"invariants alone (--oracle invariants), or as that release (--variant {nearest})"
        )
    own = getattr(reference.cls, "kvspec_variant", None) if kind == "baseline" else None
    chosen = own if isinstance(own, str) else nearest
    if note is not None:
        against = "the baseline" if kind == "baseline" else "its invariants"
        note(f"note: {unknown}; driven as {chosen}, compared with {against} only")
    return comp.check_variant(chosen) if chosen else None
