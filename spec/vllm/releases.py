"""The CPU offload manager's behaviour changes from vLLM 0.28.0 to 0.33.0, as named features.

Source: docs/vllm-releases.md (rules R29–R33, checked by running each release). Each feature is a
constructor keyword of ``CPUOffloadingManager`` whose default is the #50992 state (= 0.28.0);
:data:`RELEASES` says which features a release has. The two helpers here are the steps of
``prepare_store`` that the features change, shared by the spec and the impl (the features are
upstream facts, not optimisations).

* ``threshold_counting`` — when the store-threshold tracker counts a key: ``"lookup"`` (0.28.0:
  every ``lookup``), ``"store"`` (0.29.0: every key offered to ``prepare_store``, once per
  occurrence, the oldest entry dropped per insert — a batch can push out its own entries) or
  ``"store_batch"`` (0.30.0+: the batch's tracked keys are bumped first, then new keys replace only
  entries that are not the batch's; with none left a new key stays untracked). Either store mode
  counts before the filter and is kept when the call returns ``None``.
* ``threshold_scope`` — which input keys the threshold filters: ``"all_inputs"`` (≤ 0.30.0: every
  input key, so a cached key whose count aged out is neither stored nor protected) or
  ``"new_only"`` (0.31.0+: only uncached keys are filtered, and every input key is protected).
* ``arc_store_miss`` — 0.31.0+ (ARC): the keys about to be stored adapt the ARC target like ghost
  hits (``on_store_miss``), before the eviction check, and the effect stays when the call returns
  ``None``.
* ``failed_store_event`` — 0.33.0: a failed ``complete_store`` emits a ``removed=True``,
  ``metadata_only`` event, and ``take_events`` drops from such events the keys cached again since.
* ``arc_t1_fallback`` (0.30.0+, #55461) and ``lru`` (0.31.0+ ranks LRU by insertion and touch,
  which is ``"v1"`` for kvspec's operations) are the policies' own variants.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from spec.vllm import Key

ThresholdCounting = Literal["lookup", "store", "store_batch"]
ThresholdScope = Literal["all_inputs", "new_only"]
THRESHOLD_COUNTINGS: tuple[ThresholdCounting, ...] = ("lookup", "store", "store_batch")
THRESHOLD_SCOPES: tuple[ThresholdScope, ...] = ("all_inputs", "new_only")

_R30: dict[str, Any] = {"threshold_counting": "store_batch", "arc_t1_fallback": True}
_R31: dict[str, Any] = {
    **_R30,
    "threshold_scope": "new_only",
    "arc_store_miss": True,
    "lru": "v1",
}
RELEASES: dict[str, dict[str, Any]] = {
    "0.28": {},
    "0.29": {"threshold_counting": "store"},
    "0.30": _R30,
    "0.31": _R31,
    "0.32": _R31,  # API only: get_load_source
    "0.33": {**_R31, "failed_store_event": True},
    # API only: touch() is gone from the manager and its policies; the per-request
    # "counted once" rule of store offers needs a request seen twice, which kvspec's calls
    # (a fresh request context each) never are
    "0.34": {**_R31, "failed_store_event": True},
}
"""Release (major.minor) -> the constructor keywords of its behaviour. ``arc_*`` keywords are
ignored by LRU and ``lru`` by ARC."""


REMOVED_CALLS: dict[str, tuple[str, ...]] = {"0.34": ("touch",)}
"""Release -> the manager methods it no longer has (the checkers do not call them)."""


def has_call(variant: str | None, method: str) -> bool:
    """Whether the release behind ``variant`` (``rX.Y``; any other variant: the #50992 state)
    still has ``method``."""
    if not variant or not variant.startswith("r"):
        return True
    return method not in REMOVED_CALLS.get(variant[1:], ())


def release_keywords(policy: str, release: str) -> dict[str, Any]:
    """The keywords of ``release`` that apply to ``policy`` (``"arc"`` or ``"lru"``)."""
    own = "arc_" if policy == "arc" else "lru"
    return {
        k: v
        for k, v in RELEASES[release].items()
        if not k.startswith(("arc_", "lru")) or k.startswith(own)
    }


def record_offers(
    counts: OrderedDict[Key, int], keys: Sequence[Key], max_size: int, mode: ThresholdCounting
) -> None:
    """Count the keys offered to ``prepare_store`` in the tracker ``counts`` (oldest first).

    Pre: ``mode`` is ``"store"`` or ``"store_batch"``. Post (``"store"``): each key in input
    order is bumped and made newest, or inserted with count 1 after the oldest entry is dropped
    when the tracker is full. Post (``"store_batch"``): keys already tracked are bumped and made
    newest; then each other key, in input order, is inserted with count 1, dropping the oldest
    entry that is not one of the batch's when the tracker is full — or left untracked when every
    entry is the batch's.
    """
    if mode == "store":
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
            else:
                if len(counts) >= max_size:
                    counts.popitem(last=False)
                counts[key] = 1
        return
    batch = set()
    for key in keys:
        if key in counts:
            counts.move_to_end(key)
            counts[key] += 1
            batch.add(key)
    spare = len(counts) - len(batch)  # entries that are not the batch's, oldest first
    for key in keys:
        if key in counts:
            continue
        if len(counts) >= max_size:
            if spare == 0:
                continue  # no room without dropping the batch's own entries: untracked
            counts.popitem(last=False)
            spare -= 1
        counts[key] = 1


def select_store_keys(
    keys: Sequence[Key],
    counts: OrderedDict[Key, int] | None,
    threshold: int,
    is_cached: Callable[[Key], bool],
    scope: ThresholdScope,
) -> tuple[list[Key], set[Key], int]:
    """``(keys_to_store, protected, skipped)`` of a ``prepare_store``: the keys to allocate (input
    order), the keys its eviction must not take, and how many the threshold filtered out.

    ``"all_inputs"``: the filter keeps the input keys counted ``threshold`` times (all of them
    without a tracker); the uncached kept keys are stored; the kept keys are protected.
    ``"new_only"``: the uncached input keys are the candidates, the filter applies to them only;
    every input key is protected.
    """

    def passes(key: Key) -> bool:
        return counts is None or counts.get(key, 0) >= threshold

    if scope == "all_inputs":
        kept = [k for k in keys if passes(k)]
        return [k for k in kept if not is_cached(k)], set(kept), len(keys) - len(kept)
    candidates = [k for k in keys if not is_cached(k)]
    keys_to_store = [k for k in candidates if passes(k)]
    return keys_to_store, set(keys), len(candidates) - len(keys_to_store)
