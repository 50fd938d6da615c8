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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec import components
from kvspec.targets import load_target
from stateful_tests.checker import check_inputs, make_machine


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
    wrong."""
    comp = components.get(component)
    cls = load_target(comp.name, target)[1] if isinstance(target, str) else target
    return make_machine(
        comp.checker_def,
        cls,
        comp.check_variant(variant),
        comp.options(**options),
        seed_label=comp.name,
        derandomize=False,  # the suite's settings decide, as for any other state machine
        inputs=check_inputs(inputs),
    )
