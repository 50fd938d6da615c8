"""SGLang allocators' free groups and ``need_sort`` staging (docs/sglang.md §1.4–§1.5, issue 30):
the spec's rules and quirks, the impl agreeing, the planted bugs caught, the explorer reaching
them in its default scope."""

from __future__ import annotations

from typing import Any

import pytest

from impl.sglang import allocator as impl_alloc
from impl.sglang.radix_cache import RadixCache as ImplCache
from kvspec import components, kill_matrix
from kvspec import exploration as cli_explore
from proofs import explorer
from proofs.explorer.model_sglang import RadixCacheBounds
from spec.errors import DoubleFreeError, NestedFreeGroup
from spec.sglang import allocator as spec_alloc
from spec.sglang.radix_cache import read_allocator_groups

NAME = "sglang-radix-cache"


def _both(size: int, page_size: int, need_sort: bool) -> list[Any]:
    impl = (
        impl_alloc.TokenToKVPoolAllocator(size, need_sort)
        if page_size == 1
        else impl_alloc.PagedTokenToKVPoolAllocator(size, page_size, need_sort)
    )
    return [spec_alloc.make_allocator(size, page_size, need_sort), impl]


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_token_group_defers_frees_then_appends_them_at_the_tail(which: int) -> None:
    a = _both(4, 1, False)[which]
    got = a.alloc(3)
    a.free_group_begin()
    a.free([got[1]])
    a.free([got[0]])
    assert list(a.free_pages) == [4] and a.available_size() == 1  # deferred: not available
    assert read_allocator_groups(a) == ((), True, (2, 1))
    a.free_group_end()
    assert list(a.free_pages) == [4, 2, 1]
    assert read_allocator_groups(a) == ((), False, ())


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_paged_group_end_releases_free_pages_sorted_then_segment_pages(which: int) -> None:
    a = _both(8, 2, False)[which]  # pages 1..4
    got = a.alloc(8)
    a.free_group_begin()
    a.free_segment(got[6:8], 0)  # page 4, via its page ids
    a.free([got[2], got[0], got[1]])  # pages 2 and 1, via slots
    assert read_allocator_groups(a) == ((), True, (1, 2, 4))
    a.free_group_end()
    assert list(a.free_pages) == [4, 1, 2]  # the page ids land at the head last


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_a_free_pending_in_the_group_cannot_be_freed_again(which: int) -> None:
    a = _both(4, 1, False)[which]
    got = a.alloc(2)
    a.free_group_begin()
    a.free([got[0]])
    with pytest.raises(DoubleFreeError):
        a.free([got[1], got[0]])
    assert read_allocator_groups(a) == ((), True, (1,))  # nothing changed


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_nested_begin_is_refused_and_an_unopened_end_does_nothing(which: int) -> None:
    a = _both(4, 1, False)[which]
    a.free_group_end()  # quirk: no group open, a no-op
    assert list(a.free_pages) == [1, 2, 3, 4]
    a.free_group_begin()
    a.free(a.alloc(1))
    with pytest.raises(NestedFreeGroup):
        a.free_group_begin()
    assert read_allocator_groups(a) == ((), True, (1,))


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_need_sort_stages_frees_and_merges_sorted_when_an_alloc_is_short(which: int) -> None:
    a = _both(4, 1, True)[which]
    got = a.alloc(3)
    a.free([got[2], got[0]])
    assert list(a.free_pages) == [4] and list(a.staged_pages) == [3, 1]
    assert a.available_size() == 3  # staged pages count as available
    assert a.alloc(1) == [4]  # enough on the list: no merge
    assert a.alloc(2) == [1, 3]  # short: merged, sorted
    assert list(a.staged_pages) == []


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_quirk_alloc_extend_merges_on_its_upper_bound(which: int) -> None:
    a = _both(8, 2, True)[which]  # pages 1..4
    got = a.alloc(6)  # pages 1, 2, 3
    a.free(got[:2])  # page 1 staged
    # one new page is needed and page 4 is free, but the bound 2 // 2 + 2 = 3 exceeds the list
    assert a.alloc_extend(0, 2, -1) == [2, 3]
    assert list(a.free_pages) == [4] and list(a.staged_pages) == []


@pytest.mark.parametrize("which", [0, 1], ids=["spec", "impl"])
def test_quirk_alloc_decode_merges_an_empty_list_without_needing_a_page(which: int) -> None:
    a = _both(4, 2, True)[which]  # pages 1..2
    got = a.alloc(4)
    a.free(got[2:])  # page 2 staged, the list empty
    assert a.alloc_decode(2, got[0]) == [got[0] + 1]  # position 1: no new page
    assert list(a.free_pages) == [2] and list(a.staged_pages) == []


def test_default_scope_reaches_groups_and_need_sort() -> None:
    scope = explorer.configurations(RadixCacheBounds, "default", component=NAME)
    assert any(v.get("need_sort") and v.get("groups") for _, v in scope)
    out = cli_explore.explore_component(
        components.get(NAME), ImplCache, "impl", variants=["lru"],
        overrides={"requests": 1}, scope="default",
    )  # fmt: skip
    cov = out.coverage()
    assert out.passed
    assert True in cov["dimensions"]["need_sort"] and True in cov["dimensions"]["groups"]
    assert not {"group_begin", "group_end"} & set(cov["unreached_operations"])


@pytest.mark.parametrize("mutant", ["group_end_keeps_pending", "merge_keeps_staging"])
def test_planted_group_and_staging_bugs_are_killed(mutant: str) -> None:
    m = next(m for m in components.get(NAME).planted if m.name == mutant)
    (row,) = kill_matrix.run_matrix([m], ["fuzzer", "explorer"], 10.0)
    assert row.killed_by == ["fuzzer", "explorer"], row
