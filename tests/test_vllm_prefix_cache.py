"""vLLM's GPU prefix cache (``vllm-prefix-cache``): the spec reproduces upstream's traces, quirks
and release variants; spec and impl agree; the checkers find every planted bug."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

from impl.vllm.kv_cache_manager import KVCacheManager as ImplManager
from kvspec import components
from spec.errors import DoubleFreeError, InvalidArgument, RequestStateError, UnknownBlockId
from spec.vllm.kv_cache_manager import KVCacheManager as SpecManager
from spec.vllm.kv_cache_manager import Request, read_prefix_cache, variant_keywords
from stateful_tests import profiles

NAME = "vllm-prefix-cache"
MANAGERS = [SpecManager, ImplManager]
Manager = Callable[..., Any]


def admit(m: Any, req: Request, num_new: int | None = None) -> list[int] | None:
    """The scheduler's admission: prefix hits, then ``allocate_slots``; the request advances."""
    hits, hit_tokens, _ = m.get_computed_blocks(req)
    todo = req.num_tokens - hit_tokens if num_new is None else num_new
    out = m.allocate_slots(req, todo, hit_tokens, hits)
    if out is None:
        return None
    req.num_computed_tokens = hit_tokens + todo
    return [b.block_id for b in out.blocks[0]]


def queue(m: Any) -> list[int]:
    return list(read_prefix_cache(m).free_queue)


# ----------------------------------------------------------------------------- upstream traces
@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
@pytest.mark.parametrize(
    ("order", "after_free", "miss"),
    [
        ("classic", [6, 7, 8, 9, 10, 4, 5, 3, 2, 1], [7, 8, 9, 10, 4, 5, 6, 3, 2, 1]),
        ("unhashed_first", [5, 4, 6, 7, 8, 9, 10, 3, 2, 1], [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]),
    ],
)
def test_upstream_prefill_trace(
    cls: Manager, order: str, after_free: list[int], miss: list[int]
) -> None:
    """``tests/v1/core/test_prefix_caching.py::test_prefill`` (docs/vllm.md §5.2), both orders."""
    m = cls(11, 16, 1000, free_order=order)
    common = list(range(48))
    r0, r1 = (Request(f"r{i}", common + [100 * (i + 1) + j for j in range(7)], 16) for i in (0, 1))
    assert admit(m, r0) == [1, 2, 3, 4]
    assert m.get_computed_blocks(r1)[0].get_block_ids() == ([1, 2, 3],)
    assert admit(m, r1) == [5]
    m.free(r0)
    m.free(r1)
    assert queue(m) == after_free
    r2 = Request("r2", common + [300 + j for j in range(7)], 16)
    assert admit(m, r2) == [after_free[0] if order == "unhashed_first" else 6]
    m.free(r2)
    assert admit(m, Request("r3", list(range(500, 660)), 16)) == miss


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("classic", [10, 6, 5, 4, 3, 2, 1, 9, 8, 7]),
        ("unhashed_first", [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]),
    ],
)
def test_upstream_evict_trace(cls: Manager, order: str, expected: list[int]) -> None:
    """``test_evict``: a 5-full + 1-partial request and a 3-full request, freed in turn: the
    partial block goes to the head with #42656, to the tail before it (G15)."""
    m = cls(11, 16, 1000, free_order=order)
    r0 = Request("r0", list(range(5 * 16 + 7)), 16)
    r1 = Request("r1", list(range(1000, 1000 + 3 * 16)), 16)
    assert admit(m, r0) == [1, 2, 3, 4, 5, 6]
    assert admit(m, r1) == [7, 8, 9]
    m.free(r0)
    m.free(r1)
    assert queue(m) == expected


# ----------------------------------------------------------------------------- quirks
@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_quirk_tracked_without_hash(cls: Manager) -> None:
    """A first chunk that fills no block leaves no cached count: the next step takes the
    new-request path (and a later full block is cached from block 0)."""
    m = cls(6, 4, 64)
    r = Request("r", [1, 2, 3, 4, 5], 4)
    assert admit(m, r, 2) == [1]
    snap = read_prefix_cache(m)
    assert snap.num_cached_block == () and snap.req_to_blocks == (("r", (1,)),)
    assert m.allocate_slots(r, 3) is not None
    assert read_prefix_cache(m).num_cached_block == (("r", 1),)


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_quirk_common_prefix_creates_entry(cls: Manager) -> None:
    """Up to 0.31 the common-prefix count of an unknown request id adds an empty block list,
    which then counts as a request holding blocks; 0.32+ answer [0]."""
    old = cls(6, 2, 32, **variant_keywords("r0.31"))
    r = Request("r", [1, 2, 3], 2)
    admit(old, r)
    assert old.get_num_common_prefix_blocks("r") == [2]
    assert old.get_num_common_prefix_blocks("ghost") == [0]
    assert old.get_num_common_prefix_blocks("r") == [0]  # two "holders" now
    assert dict(read_prefix_cache(old).req_to_blocks)["ghost"] == ()
    new = cls(6, 2, 32, **variant_keywords("r0.32"))
    admit(new, Request("r", [1, 2, 3], 2))
    assert new.get_num_common_prefix_blocks("r") == [0]


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_quirk_clamp_at_max_model_len(cls: Manager) -> None:
    m = cls(10, 2, 6)
    r = Request("r", [1, 2, 3], 2)
    assert admit(m, r) == [1, 2]
    assert m.allocate_slots(r, 50).get_block_ids() == ([3],)  # 6 slots, not 53
    assert m.allocate_slots(r, 50) is m.empty_kv_cache_blocks


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_failed_allocation_touches_nothing(cls: Manager) -> None:
    """#11565: hits are touched only after the capacity check, so ``None`` changes nothing."""
    m = cls(4, 2, 32)
    a = Request("a", [1, 2, 3, 4, 5], 2)
    admit(m, a)
    m.free(a)
    b = Request("b", [1, 2, 3, 4, 9, 9, 9, 9, 9], 2)
    before = read_prefix_cache(m)
    hits, n, _ = m.get_computed_blocks(b)
    assert n == 4 and m.allocate_slots(b, 5, n, hits) is None
    assert read_prefix_cache(m) == before


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_bad_inputs_are_rejected_without_change(cls: Manager) -> None:
    m = cls(6, 2, 8)
    r = Request("r", [1, 2, 3], 2)
    admit(m, r)
    blocks = m.pop_blocks_for_free(r)
    m.block_pool.free_blocks(blocks[::-1])
    before = read_prefix_cache(m)
    with pytest.raises(DoubleFreeError):
        m.block_pool.free_blocks(blocks[::-1])
    with pytest.raises(UnknownBlockId):
        m.evict_blocks({1, 6})
    with pytest.raises(UnknownBlockId):
        m.evict_blocks({-1})
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        m.allocate_slots(r, 0)
    s = Request("s", [1, 2, 3], 2)
    hits, n, _ = m.get_computed_blocks(s)
    with pytest.raises(InvalidArgument):
        m.allocate_slots(s, 1, n + 1, hits)  # token count != hits * block_size
    with pytest.raises(InvalidArgument):
        m.allocate_slots(Request("long", list(range(9)), 2), 9)  # past max_model_len
    assert read_prefix_cache(m) == before
    admit(m, s)
    with pytest.raises(RequestStateError):
        m.allocate_slots(s, 1, n, hits)  # hits for a request holding blocks
    m.free(s)
    m.free(s)  # a second free, and an unknown request: nothing happens
    m.free(Request("never", [1], 2))


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_release_variants(cls: Manager) -> None:
    """0.31 adopts hits without new tokens; 0.33 caps the hit length."""
    for variant, adopts in (("r0.30", False), ("r0.31", True)):
        m = cls(6, 2, 16, **variant_keywords(variant))
        admit(m, Request("a", [1, 2, 3], 2))
        b = Request("b", [1, 2, 5], 2)
        hits, n, _ = m.get_computed_blocks(b)
        if adopts:
            assert m.allocate_slots(b, 0, n, hits) is m.empty_kv_cache_blocks
            assert dict(read_prefix_cache(m).req_to_blocks)["b"] == (1,)
        else:
            with pytest.raises(ValueError):
                m.allocate_slots(b, 0, n, hits)
    old = cls(6, 2, 16, **variant_keywords("r0.32"))
    with pytest.raises(TypeError):
        old.get_computed_blocks(Request("a", [1, 2, 3], 2), 2)
    new = cls(6, 2, 16)
    admit(new, Request("a", [1, 2, 3, 4, 5], 2))
    assert new.get_computed_blocks(Request("b", [1, 2, 3, 4, 5], 2), 2)[1] == 2


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_release_0_34(cls: Manager) -> None:
    """0.34 clamps an explicit hit bound to ``num_tokens - 1`` and has no common-prefix count."""
    for variant, hit in (("r0.33", 2), ("r0.34", 0)):
        m = cls(6, 2, 16, **variant_keywords(variant))
        admit(m, Request("a", [1, 2, 3], 2))
        assert m.get_computed_blocks(Request("b", [1, 2], 2), 4)[1] == hit
    gone = cls(6, 2, 16, **variant_keywords("r0.34"))
    admit(gone, Request("a", [1, 2, 3], 2))
    with pytest.raises(InvalidArgument, match=r"does not exist in 0\.34"):
        gone.get_num_common_prefix_blocks("a")


def test_the_reader_reads_the_0_34_hash_index_layout() -> None:
    """0.34's index maps hashes to block ids, duplicates apart: the snapshot is the same."""
    m = SpecManager(8, 2, 16)
    admit(m, Request("a", [1, 2, 3, 4], 2))
    admit(m, Request("b", [5, 6, 7], 2))
    before = read_prefix_cache(m)
    index = m.block_pool.cached_block_hash_to_block
    cache: dict[Any, Any] = index._cache
    ids: dict[Any, int] = {}
    dups: dict[Any, dict[int, None]] = {}
    for key, entry in cache.items():
        if isinstance(entry, dict):
            ids[key] = next(iter(entry))
            dups[key] = dict.fromkeys(entry)
        else:
            ids[key] = entry.block_id
    first = next(iter(ids))
    dups[first] = {ids[first]: None, 7: None}  # a second block cached under one key
    index._cache, index._dup_ids = ids, dups  # type: ignore[assignment, attr-defined]
    after = read_prefix_cache(m)
    expected = dict(before.cached)
    label = next(k for k, v in expected.items() if v[0] == ids[first])
    expected[label] = (ids[first], 7)
    assert dict(after.cached) == expected


# ----------------------------------------------------------------------------- the checkers
def test_check_impl_passes_and_reaches_the_paths() -> None:
    ci = settings(profiles.get("ci"), max_examples=40)
    result = components.get(NAME).check(ImplManager, "impl", ci)
    assert result.passed, result.failure
    reached = set(result.coverage)
    assert {
        "path:prefix_hit",
        "path:hit_on_free_block",
        "path:duplicate_cache_entries",
        "path:allocation_refused",
        "path:evicted_cached_block",
        "path:unhashed_freed_to_head",
        "path:block_freed_twice_in_one_call",
        "path:reset_done",
        "path:reset_refused",
        "path:quiescent",
        "raise:free_blocks:DoubleFreeError",
        "raise:evict_blocks:UnknownBlockId",
    } <= reached, sorted(reached)


@pytest.mark.parametrize("variant", ["classic", "r0.28", "r0.31", "r0.33"])
def test_fuzz_impl_per_variant(variant: str) -> None:
    result = components.get(NAME).fuzz(ImplManager, "impl", 3_000, 5, variant=variant)
    assert result.passed, result.failure


def test_explorer_covers_a_small_scope_in_every_variant() -> None:
    from kvspec.exploration import explore_component

    comp = components.get(NAME)
    out = explore_component(
        comp, ImplManager, "impl", overrides={"max_model_len": 2, "requests": 1}
    )
    doc = out.to_json()
    assert out.passed and doc["complete"] and len(doc["runs"]) == len(comp.variants)
    assert all(r["distinct_states"] > 20 for r in doc["runs"])


@pytest.mark.parametrize(
    ("mutant", "checks"),
    [
        ("touch_before_capacity_check", {"atomic_failure"}),
        ("unhashed_freed_blocks_to_tail", {"identical_eviction_order"}),
        ("duplicate_hash_entries_deleted_wholesale", {"prefix_index_consistent"}),
    ],
)
def test_well_formed_calls_find_the_real_bug_paths(mutant: str, checks: set[str]) -> None:
    """These upstream bugs need no bad input: the well-formed alphabet finds them."""
    comp = components.get(NAME)
    m = comp.planted[[p.name for p in comp.planted].index(mutant)]
    result = comp.fuzz(m.cls, mutant, 30_000, 0, inputs="well-formed", **comp.mutant_options(m))
    assert not result.passed and result.failure is not None
    assert result.failure.check in checks, result.failure


def test_explorer_finds_a_planted_bug_with_a_short_trace() -> None:
    from kvspec.exploration import explore_component

    comp = components.get(NAME)
    m = comp.planted[[p.name for p in comp.planted].index("unhashed_freed_blocks_to_tail")]
    out = explore_component(comp, m.cls, "mutant", variants=["unhashed_first"],
                            overrides={"max_model_len": 2, "requests": 1})  # fmt: skip
    violations = out.to_json()["violations"]
    assert violations and violations[0]["check"] == "identical_eviction_order"
    assert violations[0]["depth"] <= 4 and violations[0]["replay"] == "reproduced"


def test_a_fuzzed_counterexample_replays_on_the_bug_and_not_on_the_impl() -> None:
    comp = components.get(NAME)
    m = comp.planted[[p.name for p in comp.planted].index("touch_before_capacity_check")]
    failed = comp.fuzz(m.cls, "mutant", 5_000, 0, inputs="well-formed")
    assert failed.trace is not None and not failed.passed
    again = comp.replay(failed.trace, m.cls, "mutant")
    assert again.failure is not None and again.failure.check == failed.trace["failure"]["check"]
    assert comp.replay(failed.trace, ImplManager, "impl").passed
