"""SGLang's radix cache: the spec's behaviour (docs/sglang.md), the impl against it under every
checker, the planted bugs, and — when ``KVSPEC_SGLANG_WHEEL`` names a downloaded release wheel
(``pip download sglang==0.5.23 --no-deps``) — the release's own ``RadixCache`` as a target."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from impl.sglang.radix_cache import RadixCache as ImplCache
from kvspec import components
from kvspec.cli import main
from kvspec.engines.sglang import sglang_standins
from spec import invariants as inv
from spec.errors import (
    DoubleFreeError,
    InvalidArgument,
    InvalidPageId,
    LockRefUnderflow,
    UnknownNode,
)
from spec.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from spec.sglang.radix_cache import RadixCache, read_radix_cache
from stateful_tests.sglang_harness import Config, RadixHarness, read

NAME = "sglang-radix-cache"
CACHES = [pytest.param(RadixCache, id="spec"), pytest.param(ImplCache, id="impl")]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main([*argv, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return rc, document


# ----------------------------------------------------------------------------- allocators
def test_token_allocator_reserves_slot_zero_and_reuses_fifo() -> None:
    a = TokenToKVPoolAllocator(4)
    assert a.alloc(2) == [1, 2] and a.alloc(3) is None
    a.free([2])
    a.free([1])
    assert a.alloc(4) == [3, 4, 2, 1]  # freed slots join the tail in order


def test_paged_allocator_reuses_lifo_and_continues_a_partial_page() -> None:
    a = PagedTokenToKVPoolAllocator(8, 2)  # pages 1..4
    assert a.alloc_extend(0, 3, -1) == [2, 3, 4]  # pages 1, 2: the last one half used
    assert a.alloc_decode(4, 4) == [5]  # position 3 continues page 2
    assert a.alloc_decode(5, 5) == [6]  # position 4 opens page 3
    a.free_segment([2, 3], 0)
    assert a.free_pages == [1, 4]  # back at the head
    assert a.alloc_extend(4, 7, 5) == [2, 3, 8]  # the head page first, then page 4


@pytest.mark.parametrize("bad", [[0], [9], [2, 2]])
def test_allocators_reject_bad_frees_before_changing_anything(bad: list[int]) -> None:
    a = TokenToKVPoolAllocator(8)
    a.alloc(3)
    with pytest.raises((DoubleFreeError, InvalidPageId)):
        a.free([*bad, 1] if bad != [2, 2] else bad)
    with pytest.raises(DoubleFreeError):
        a.free([5])  # still free
    assert a.free_pages == list(range(4, 9))


# ----------------------------------------------------------------------------- the tree
@pytest.mark.parametrize("cls", CACHES)
def test_match_splits_once_and_refreshes_the_path(cls: type) -> None:
    c = cls(8)
    assert c.insert([1, 2, 3], [1, 2, 3]) == 0
    slots, node = c.match_prefix([1, 2, 9])
    assert slots == [1, 2] and c.node_path(node) == (1, 2)
    snap = read_radix_cache(c)
    assert [n.path for n in snap.nodes] == [(1, 2), (1, 2, 3)]
    assert snap.nodes[0].access_rank > snap.nodes[1].access_rank  # the upper half is newer


@pytest.mark.parametrize("cls", CACHES)
def test_pages_truncate_keys_and_split_only_at_page_boundaries(cls: type) -> None:
    c = cls(16, page_size=2)
    assert c.insert([1, 2, 3, 4, 5], [2, 3, 4, 5, 6]) == 0  # the fifth token is not cached
    slots, node = c.match_prefix([1, 2, 3, 9])  # diverges inside the second page
    assert slots == [2, 3] and c.node_path(node) == (1, 2)
    assert c.match_prefix([1])[0] == [] and inv.tree_page_aligned(read_radix_cache(c)) is None


def cached(c: Any, tokens: list[int]) -> int:
    """Insert ``tokens`` with freshly allocated slots, freeing the ones the tree already had."""
    a = c.token_to_kv_pool_allocator
    slots = a.alloc(len(tokens))
    found = int(c.insert(tokens, slots))
    if found:
        a.free(slots[:found])
    return found


@pytest.mark.parametrize("cls", CACHES)
def test_eviction_frees_whole_lru_leaves_and_then_their_parents(cls: type) -> None:
    c = cls(8)
    cached(c, [1, 2, 3])  # slots 1, 2, 3
    c.match_prefix([1, 2, 7])  # split: (1, 2) with the leaf (3)
    assert cached(c, [1, 2, 4]) == 2  # a second, newer leaf (4): slot 6 (4, 5 were duplicates)
    assert c.evict(1) == 1  # the older leaf only (it frees one slot)
    assert c.evict(2) == 3  # overshoots: the leaf (4), then its parent, now a leaf
    assert list(c.token_to_kv_pool_allocator.free_pages)[-4:] == [3, 6, 1, 2]
    assert c.evictable_size() == c.protected_size() == 0


@pytest.mark.parametrize("cls", CACHES)
def test_locks_cover_the_path_and_block_eviction(cls: type) -> None:
    c = cls(8)
    cached(c, [1, 2, 3])
    _, node = c.match_prefix([1, 2, 3])
    assert c.inc_lock_ref(node) == -3 and c.inc_lock_ref(node) == 0
    assert c.evict(8) == 0 and (c.evictable_size(), c.protected_size()) == (0, 3)
    assert c.dec_lock_ref(node) == 0 and c.dec_lock_ref(node) == 3
    with pytest.raises(LockRefUnderflow):
        c.dec_lock_ref(node)  # upstream: lock_ref -1, no error
    assert c.evict(8) == 3
    with pytest.raises(UnknownNode):
        c.inc_lock_ref(node)


@pytest.mark.parametrize(
    ("policy", "kept"), [("lru", [(1,), (2,)]), ("fifo", [(2,), (2,)]), ("mru", [(2,), (1,)])]
)
def test_eviction_policies_are_named_variants(policy: str, kept: list[tuple[int, ...]]) -> None:
    """Leaves 1 then 2 are cached, then one is matched (used again): which one survives."""
    for cls in (RadixCache, ImplCache):
        for used, survivor in zip(([1], [2]), kept, strict=True):
            c = cls(8, eviction_policy=policy)
            cached(c, [1])
            cached(c, [2])
            c.match_prefix(used)
            assert c.evict(1) == 1
            assert [n.path for n in read_radix_cache(c).nodes] == [survivor], (cls, used)


def test_the_scheduler_harness_conserves_slots_through_a_request_life() -> None:
    h = RadixHarness(RadixCache, Config(size=6, page_size=1))
    assert h.admit("a", [1, 2, 3]) == {"prefix": 0, "node": [], "new": [1, 2, 3]}
    assert h.decode("a", 4) == 4
    assert h.finish("a") == {"cached": 0, "protected": 4}
    out = h.admit("b", [1, 2, 3, 4, 5])
    assert out == {"prefix": 4, "node": [1, 2, 3, 4], "new": [5]}
    s = read(h)
    for check in (inv.radix_slot_conservation, inv.radix_lock_refs_match_holders,
                  inv.radix_rows_match_tree, inv.evictable_plus_protected_is_tree_size):  # fmt: skip
        assert check(s) is None
    assert h.admit("c", [7, 7, 7]) is None  # no room: b holds everything it needs


def test_checkpoint_splits_the_leaf_at_the_prompt_boundary() -> None:
    """SGLang re-inserts the prompt after the request's tokens: the decoded part becomes a leaf of
    its own, evicted before the prompt."""
    h = RadixHarness(RadixCache, Config(size=8, page_size=1))
    h.admit("a", [1, 2, 3])
    h.decode("a", 4)
    h.finish("a")
    assert [n.path for n in read(h).nodes] == [(1, 2, 3), (1, 2, 3, 4)]
    assert h.evict(1) == 1 and [n.path for n in read(h).nodes] == [(1, 2, 3)]


# ----------------------------------------------------------------------------- the checkers
def test_check_fuzz_and_explore_pass_on_the_impl(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run_json(capsys, "check", NAME)
    assert rc == 0 and doc["passed"]
    wanted = {"path:prefix_hit", "path:split_on_match", "path:evicted_around_locks",
              "path:evict_all_locked", "path:allocation_refused", "rule:bad_unlock_twice"}  # fmt: skip
    assert wanted <= set(doc["coverage"]), wanted - set(doc["coverage"])
    rc, doc = run_json(capsys, "fuzz", NAME, "--ops", "4000", "--seed", "3")
    assert rc == 0 and doc["divergences"] == 0
    rc, doc = run_json(capsys, "explore", NAME, "--requests", "1", "--pages", "2")
    assert rc == 0 and doc["complete"] and doc["distinct_states"] > 100


@pytest.mark.parametrize("mutant", [m.name for m in components.get(NAME).planted])
def test_every_planted_bug_is_killed_by_the_explorer(
    mutant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    m = next(m for m in components.get(NAME).planted if m.name == mutant)
    extra: list[str] = []  # the mutant's options as explorer bounds (flags for booleans)
    for k, v in m.options.items():
        flag = "--" + k.replace("_", "-")
        extra += [flag] if v is True else [flag, str(v)]
    rc, doc = run_json(
        capsys, "explore", NAME, "--target", f"mutant:{mutant}", "--variant", "lru",
        "--requests", "2", "--pages", "3", *extra,
    )  # fmt: skip
    # the checker replays it too (it may name the invariant behind a snapshot difference)
    replay = doc["violations"][0]["replay"]
    assert rc == 1 and replay.startswith(("reproduced", "diverged differently")), replay


# ----------------------------------------------------------------------------- real SGLang
WHEEL = os.environ.get("KVSPEC_SGLANG_WHEEL")


def test_standins_refuse_a_source_without_the_files(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    assert sglang_standins.main([str(tmp_path / "src"), str(tmp_path / "dest")]) == 2


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not WHEEL:
        pytest.skip("KVSPEC_SGLANG_WHEEL does not name an SGLang wheel")
    tree = tmp_path_factory.mktemp("sglang")
    assert sglang_standins.main([WHEEL, str(tree)]) == 0
    sys.path.insert(0, str(tree))
    try:
        yield tree
    finally:
        sys.path.remove(str(tree))


def test_real_sglang_passes_check_and_fuzz_on_well_formed_inputs(
    release: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["check", NAME], ["fuzz", NAME, "--ops", "5000", "--seed", "1"]):
        rc, doc = run_json(capsys, *argv, "--target", "sglang", "--inputs", "well-formed")
        assert rc == 0 and doc["target"] == "sglang", doc
    rc, doc = run_json(capsys, "explore", NAME, "--target", "sglang", "--variant", "lru",
                       "--requests", "1", "--pages", "2", "--inputs", "well-formed")  # fmt: skip
    assert rc == 0 and doc["complete"]


def test_real_sglang_runs_its_own_checkpoint(release: Path) -> None:
    from kvspec.engines.sglang.sglang_adapter import SglangRadixCache

    real = RadixHarness(SglangRadixCache, Config(size=8, page_size=2))
    spec = RadixHarness(RadixCache, Config(size=8, page_size=2))
    for h in (real, spec):
        h.admit("a", [1, 2, 3])
        h.decode("a", 4)
        h.decode("a", 5)
    assert real.checkpoint("a") == spec.checkpoint("a") == {"cached": 0, "protected": 4}
    assert read(real) == read(spec) and [n.path for n in read(real).nodes] == [(1, 2), (1, 2, 3, 4)]


def test_real_sglang_lock_underflow_leaves_lock_ref_minus_one(release: Path) -> None:
    from kvspec.engines.sglang.sglang_adapter import SglangRadixCache

    c = SglangRadixCache(8)
    c.insert([1, 2], [1, 2])
    _, node = c.match_prefix([1, 2])
    c.inc_lock_ref(node)
    c.dec_lock_ref(node)
    assert c.dec_lock_ref(node) == 0  # accepted: no underflow check
    assert node.lock_ref == -1
    problem = inv.evictable_plus_protected_is_tree_size(read_radix_cache(c))
    assert problem is not None and "negative lock_ref" in problem


# ----------------------------------------------------------------------------- UnifiedRadixCache
@pytest.mark.parametrize("cls", CACHES)
def test_unified_split_keeps_the_lower_nodes_creation_time(cls: type) -> None:
    """``UnifiedRadixCache`` (docs/sglang.md §8.2): a split's upper half inherits the creation
    time, so under FIFO it is older than a leaf cached between the two; ``RadixCache`` dates it
    at the split, so the leaf goes first."""
    kept = {}
    for variant in ("fifo", "unified-fifo"):
        c = cls(8, eviction_policy=variant)
        cached(c, [1, 2])  # created first
        cached(c, [3])  # created second
        c.match_prefix([1, 9])  # splits (1, 2): the upper half (1)
        assert c.evict(1) == 1  # the oldest leaf: (1, 2)'s lower half in both
        assert c.evict(1) == 1  # then (3) (RadixCache) or the upper half (1) (unified)
        kept[variant] = [n.path for n in read_radix_cache(c).nodes]
    assert kept == {"fifo": [(1,)], "unified-fifo": [(3,)]}


@pytest.mark.parametrize("cls", CACHES)
def test_unified_insert_frees_duplicates_one_node_at_a_time(cls: type) -> None:
    """The unified insert frees the caller's duplicates from ``prev_prefix_len`` on, one
    ``free_segment`` per tree node: with pages (freed to the head) the nodes' pages come back in
    reverse node order."""
    c = cls(16, page_size=2, eviction_policy="unified-lru")
    a = c.token_to_kv_pool_allocator
    first = a.alloc(4)  # pages 1, 2
    c.insert_result([1, 1, 2, 2], first)
    c.match_prefix([1, 1, 3, 3])  # splits: (1, 1) and (1, 1, 2, 2)
    again = a.alloc(4)  # pages 3, 4: duplicates of the cached two pages
    assert c.insert_result([1, 1, 2, 2], again, 0)[0] == 4
    assert list(a.free_pages)[:2] == [4, 3]  # page 3 freed first, then page 4 before it
    with pytest.raises(InvalidArgument):
        cls(8).insert_result([1], [1], 0)  # RadixCache's insert frees nothing


def test_unified_variants_pass_on_the_impl(capsys: pytest.CaptureFixture[str]) -> None:
    for variant in ("unified-lru", "unified-fifo", "unified-mru"):
        rc, doc = run_json(
            capsys, "fuzz", NAME, "--ops", "3000", "--seed", "5", "--variant", variant
        )
        assert rc == 0 and doc["divergences"] == 0, (variant, doc)


UNIFIED = ["sglang-unified", "sglang-unified-rust"]


@pytest.fixture
def unified(release: Path) -> Path:
    """The release tree, where ``UnifiedRadixCache``'s one extra dependency is installed."""
    pytest.importorskip("msgspec", reason="UnifiedRadixCache imports msgspec (kvspec[sglang])")
    return release


@pytest.mark.parametrize("target", UNIFIED)
def test_real_unified_cache_passes_check_and_fuzz(
    target: str, unified: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = run_json(capsys, "check", NAME, "--target", target, "--inputs", "well-formed")
    assert rc == 0 and doc["variant"] == "unified-lru" and doc["passed"], doc
    for variant in ("unified-lru", "unified-fifo", "unified-mru"):
        rc, doc = run_json(capsys, "fuzz", NAME, "--target", target, "--inputs", "well-formed",
                           "--ops", "3000", "--seed", "1", "--variant", variant)  # fmt: skip
        assert rc == 0 and doc["divergences"] == 0, (variant, doc)
    rc, doc = run_json(capsys, "explore", NAME, "--target", target, "--variant", "unified-lru",
                       "--requests", "1", "--pages", "2", "--inputs", "well-formed")  # fmt: skip
    assert rc == 0 and doc["complete"]


@pytest.mark.parametrize("target", UNIFIED)
def test_real_unified_cache_is_not_radix_cache(
    target: str, unified: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The variants tell the two caches apart: the unified cache checked against RadixCache's
    variants diverges."""
    for variant in ("lru", "fifo"):
        rc, doc = run_json(capsys, "fuzz", NAME, "--target", target, "--inputs", "well-formed",
                           "--ops", "20000", "--seed", "2", "--variant", variant)  # fmt: skip
        assert rc == 1 and doc["divergences"] == 1, variant


@pytest.mark.parametrize("backend", ["python", "rust"])
def test_real_unified_cache_reads_locks_and_paths(backend: str, unified: Path) -> None:
    from kvspec.engines.sglang.sglang_adapter import unified_adapter_class

    cls = unified_adapter_class(backend)
    c = cls(8)
    assert type(c.upstream.tree_core).__name__.startswith("Rust" if backend == "rust" else "Uni")
    cached(c, [1, 2, 3])
    slots, node = c.match_prefix([1, 2, 9])
    assert slots == [1, 2] and c.node_path(node) == (1, 2)
    assert c.inc_lock_ref(node) == -2  # kvspec's sign: the evictable size's change
    rows = {n.path: n.lock_ref for n in read_radix_cache(c).nodes}
    assert rows == {(1, 2): 1, (1, 2, 3): 0}
    assert c.evict(8) == 1 and c.dec_lock_ref(node) == 2
    # unlike RadixCache, a double unlock is refused: an assert (Python core), a panic (Rust)
    if backend == "python":
        with pytest.raises(AssertionError):
            c.dec_lock_ref(node)
        assert inv.evictable_plus_protected_is_tree_size(read_radix_cache(c)) is None
    else:
        with pytest.raises(RuntimeError, match="lock_ref=0"):
            c.dec_lock_ref(node)
        with pytest.raises(RuntimeError, match="poisoned"):  # and the core is unusable after
            c.evictable_size()


@pytest.mark.parametrize("backend", ["python", "rust"])
def test_real_unified_cache_split_keeps_the_creation_time(backend: str, unified: Path) -> None:
    """The FIFO case of docs/sglang.md §8.2 on the real cores (the Rust one hides its times; its
    eviction order shows them): after a split, the upper half goes before a younger leaf."""
    import copy

    from kvspec.engines.sglang.sglang_adapter import adapter_class, unified_adapter_class

    for cls, survivor in ((adapter_class(), (1,)), (unified_adapter_class(backend), (3,))):
        c = cls(8, eviction_policy="fifo")
        cached(c, [1, 2])
        cached(c, [3])
        c.match_prefix([1, 9])
        twin = copy.deepcopy(c)  # the Rust adapter's copy replays the calls
        for cache in (c, twin):
            assert cache.evict(1) == 1 and cache.evict(1) == 1
            assert [n.path for n in read_radix_cache(cache).nodes] == [survivor], cls
