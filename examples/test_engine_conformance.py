"""An engine's own conformance tests with kvspec: drop this file into the engine's test suite.

kvspec's lockstep machines run the engine's class and kvspec's executable spec side by side, with
every invariant after every call; a difference fails the test with the calls that led to it (and
kvspec's pytest plugin saves them as a trace that ``kvspec replay`` re-runs). Each machine is a
Hypothesis ``RuleBasedStateMachine``: its ``.TestCase`` runs under pytest or unittest, and
unchanged under HypoFuzz (``hypothesis fuzz``).

Here kvspec's own production classes stand in for the engine's. In an engine checkout the targets
are the engine's classes, e.g. ``"infinilm.llm.cache_manager:BlockManager"`` (a module path, or
``"path/to/cache_manager.py:BlockManager"``); ``inputs="well-formed"`` keeps to legal calls, for a
class that does not share the spec's stricter contract on bad input.

    pytest examples/test_engine_conformance.py                        # the suite's own settings
    pytest examples/test_engine_conformance.py --kvspec-profile ci    # kvspec check's programs
    pytest examples/test_engine_conformance.py \
        --kvspec-target infinilm-block-manager=mutant:lifo_free_list  # a planted bug: fails
"""

from __future__ import annotations

from typing import Any

import pytest

from kvspec.testing import lockstep_machine

BLOCK_MANAGER = "impl.infinilm.block_manager:BlockManager"
SCHEDULER = "impl.infinilm.scheduler:Scheduler"
OFFLOAD_MANAGER = "impl.vllm.offload_manager:CPUOffloadingManager"

# One state machine per component, Hypothesis' own convention: the TestCase is the test.
BlockManagerConformance = lockstep_machine(
    "infinilm-block-manager", BLOCK_MANAGER, inputs="well-formed"
)
TestBlockManagerConformance = BlockManagerConformance.TestCase

LruConformance = lockstep_machine("vllm-lru", OFFLOAD_MANAGER, variant="v2")
TestLruConformance = LruConformance.TestCase


# The plugin's fixture in a plain test function, parametrised over the scheduler's variants.
@pytest.mark.parametrize("variant", ["legacy", "exact"])
def test_scheduler_conforms(kvspec_lockstep: Any, variant: str) -> None:
    kvspec_lockstep("infinilm-scheduler", SCHEDULER, variant=variant, inputs="well-formed")
