"""kvspec inside an engine's own test suite: the lockstep machine as a Hypothesis state machine.

```python
# tests/test_kvspec_conformance.py of an engine checkout
from kvspec.testing import lockstep_machine

BlockManagerConformance = lockstep_machine(
    COMPONENT, "mypkg.cache_manager:BlockManager", inputs="well-formed"
)
TestBlockManagerConformance = BlockManagerConformance.TestCase
```

where ``COMPONENT`` is a name ``kvspec check`` takes (``kvspec check --help`` lists them). The
machine is the one ``kvspec check`` runs (rules from the component's operations table,
invariants after every rule), under the suite's own Hypothesis settings and profile; a divergence
fails the test with kvspec's ``Divergence`` (its ``check``, its ``detail`` and the calls so far).

kvspec's pytest plugin (:mod:`kvspec.pytest_plugin`, installed with kvspec) can change two things
for a whole session, before the test files are collected: ``--kvspec-target`` replaces the target
that machines are built against, ``--kvspec-profile`` runs them under one of kvspec's Hypothesis
profiles (:func:`configure`). A failing machine's program is saved as a replayable trace
(:func:`trace_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvspec import components
from kvspec.targets import load_target
from stateful_tests.checker import check_inputs, make_machine


@dataclass
class Session:
    """What the pytest plugin set for this session: target overrides (component name -> target;
    the key ``None``: every component) and a Hypothesis profile name."""

    targets: dict[str | None, str] = field(default_factory=dict)
    profile: str | None = None


SESSION = Session()


def configure(targets: Mapping[str | None, str] | None = None, profile: str | None = None) -> None:
    """Set (or, with no arguments, clear) the session's overrides; the profile must exist."""
    if profile is not None:
        _settings(profile)
    SESSION.targets, SESSION.profile = dict(targets or {}), profile


def _settings(profile: str) -> Any:
    """One of kvspec's profiles (ci, dev, deep), else any profile registered with Hypothesis."""
    from hypothesis import settings

    from stateful_tests import profiles

    if profile in profiles.PROFILES:
        return profiles.get(profile)
    try:
        return settings.get_profile(profile)
    except Exception:
        raise ValueError(
            f"unknown hypothesis profile {profile!r}; kvspec's are {', '.join(profiles.PROFILES)}"
        ) from None


def _label(target: Any) -> str:
    """A target class as ``--target`` names it (``MOD:CLASS``), so a saved trace replays."""
    return f"{target.__module__}:{target.__qualname__}"


def lockstep_machine(
    component: str,
    target: str | Callable[..., Any] = "impl",
    *,
    variant: str | None = None,
    inputs: str = "all",
    **options: Any,
) -> Any:
    """The lockstep ``RuleBasedStateMachine`` class of ``component`` against ``target`` (a class,
    or a target name as ``--target`` takes it), in one ``variant`` (``None``: drawn per program),
    over ``inputs`` (``all`` or ``well-formed``); ``options`` are the component's checker flags
    (e.g. ``soundness=True``). ``ComponentError`` / ``TargetError`` / ``ValueError`` name what is
    wrong. Under kvspec's pytest plugin, ``--kvspec-target`` replaces ``target`` and
    ``--kvspec-profile`` sets the machine's ``TestCase.settings`` (derandomized as ``kvspec check``
    runs it, when the profile is)."""
    comp = components.get(component)
    chosen = SESSION.targets.get(comp.name, SESSION.targets.get(None, target))
    if isinstance(chosen, str):
        label, cls = load_target(comp.name, chosen)
    else:
        label, cls = _label(chosen), chosen
    settings = None if SESSION.profile is None else _settings(SESSION.profile)
    machine = make_machine(
        comp.checker_def,
        cls,
        comp.check_variant(variant),
        comp.options(**options),
        seed_label=comp.name,
        # the suite's settings decide, as for any other state machine (a profile given to the
        # plugin: as kvspec check decides)
        derandomize=settings is not None and bool(settings.derandomize),
        inputs=check_inputs(inputs),
    )
    machine.kvspec = {"component": comp.name, "target": label, "inputs": inputs}
    if settings is not None:
        machine.TestCase.settings = settings
    return machine


def trace_of(machine: Any, failure: Any) -> dict[str, Any] | None:
    """The replayable trace (``kvspec replay``) of ``failure``, a ``Divergence`` raised by
    ``machine`` (a class from :func:`lockstep_machine`), or ``None`` for any other machine."""
    from stateful_tests.lockstep import trace_document

    info = getattr(machine, "kvspec", None)
    driver = getattr(machine, "last_driver", None)
    config = driver.config if driver is not None else getattr(machine, "last_config", None)
    if info is None or config is None:
        return None
    return trace_document(
        info["component"],
        info["target"],
        config.to_json(),
        failure.steps,
        failure,
        inputs=info["inputs"],
    )
