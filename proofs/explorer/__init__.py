"""Exhaustive small-scope explorer: breadth-first search over every operation sequence of a spec.

Layer 3 of kvspec's checking layers ("TLC for KV caches"). From the spec's initial state, every operation
of a component's alphabet, with every argument of a bounded domain, is applied to a copy of every
reached state — and, in lockstep, to a copy of the paired *target* object (impl by default, or any
``--target``). Every edge compares what :class:`stateful_tests.lockstep.Lockstep` compares (return
value, exception kind, in-place mutation of list arguments, snapshot, ``atomic_failure``), with
Lockstep's own functions, and every reached state is checked against every invariant, under the
names of ``spec/invariants.py``.

The modules:

* :mod:`~proofs.explorer.search` — the engine: :class:`Edge`, :class:`Model` (one subclass per
  component), :func:`explore` (shortest counterexamples, state fingerprints, bounds), :func:`rebuild`.
* :mod:`~proofs.explorer.set_clone` — exact clones: CPython set tables copied verbatim
  (:func:`clone_set`, :func:`clone`), self-tested before a search (:class:`ExplorerUnsupported`).
* :mod:`~proofs.explorer.set_classes` — set tables up to behaviour: the classes of tables no
  sequence of set operations tells apart (the block manager's keys use them).
* :mod:`~proofs.explorer.model_block_manager`, :mod:`~proofs.explorer.model_scheduler`,
  :mod:`~proofs.explorer.model_offload`, :mod:`~proofs.explorer.model_prefix_cache`,
  :mod:`~proofs.explorer.model_sglang` — the
  component models and their bounds.
* :mod:`~proofs.explorer.entry` — what the commands call with a component's parts from the
  registry: :func:`make_bounds`, :func:`run` (one search per variant), :class:`Exploration`.

Every name is re-exported here: ``from proofs.explorer import X`` is the public way in.
"""

from __future__ import annotations

from proofs.explorer.entry import (
    Exploration,
    bound_names,
    configurations,
    default_scope,
    dimensions,
    make_bounds,
    plan,
    run,
    scopes,
)
from proofs.explorer.model_block_manager import (
    PIN,
    REQUEST,
    BlockManagerBounds,
    BlockManagerModel,
    Holder,
)
from proofs.explorer.model_offload import OffloadBounds, OffloadModel
from proofs.explorer.model_prefix_cache import PrefixCacheBounds, PrefixCacheModel
from proofs.explorer.model_scheduler import SchedulerBounds, SchedulerModel
from proofs.explorer.model_sglang import RadixCacheBounds, RadixCacheModel
from proofs.explorer.search import (
    Edge,
    ExploreResult,
    Model,
    Progress,
    Violation,
    explore,
    rebuild,
    rejected,
)
from proofs.explorer.set_clone import (
    ExplorerUnsupported,
    NotPortable,
    clone,
    clone_set,
    cloner_ready,
    exact_dumps,
    exact_loads,
    rebuild_set,
    set_layout,
    set_state,
)
from stateful_tests.lockstep import Check

__all__ = [
    "PIN",
    "REQUEST",
    "BlockManagerBounds",
    "BlockManagerModel",
    "Check",
    "Edge",
    "Exploration",
    "ExploreResult",
    "ExplorerUnsupported",
    "Holder",
    "Model",
    "NotPortable",
    "OffloadBounds",
    "OffloadModel",
    "PrefixCacheBounds",
    "PrefixCacheModel",
    "Progress",
    "RadixCacheBounds",
    "RadixCacheModel",
    "SchedulerBounds",
    "SchedulerModel",
    "Violation",
    "bound_names",
    "clone",
    "clone_set",
    "cloner_ready",
    "configurations",
    "default_scope",
    "dimensions",
    "exact_dumps",
    "exact_loads",
    "explore",
    "make_bounds",
    "plan",
    "rebuild",
    "rebuild_set",
    "rejected",
    "run",
    "scopes",
    "set_layout",
    "set_state",
]
