"""vLLM 0.34's hybrid KV cache groups (issue 26): full attention with sliding-window and
chunked-local groups, in spec and impl, and — where the release wheel is at hand
($KVSPEC_VLLM_WHEEL; .ci/run downloads it) — in the real release, on the same trace and fuzzed."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from impl.vllm.kv_cache_manager import KVCacheManager as ImplManager
from kvspec import components, corpus
from kvspec.engines import trees
from kvspec.targets import load_target
from spec.errors import InvalidArgument
from spec.vllm.kv_cache_manager import KVCacheManager as SpecManager
from spec.vllm.kv_cache_manager import Request, read_prefix_cache, variant_keywords

Manager = Callable[..., Any]
MANAGERS = [SpecManager, ImplManager]
THREE = (("sliding_window", 5), ("chunked_local", 4))  # after a 3-token window


def three_groups(cls: Manager, make: Callable[..., Any] = Request) -> tuple[Any, Any, Any]:
    """Full attention, windows of 3 and 5 tokens, chunks of 4: a 9-token prompt, two decodes,
    freed; then the hit of a 12-token request sharing 11 tokens. Returns (tables of the first
    request, the hit's block ids, (hit tokens, shared-prefix boundary))."""
    m = cls(24, 2, 14, **variant_keywords("r0.34"), sliding_window=3, attention_groups=THREE)
    a = make("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], 2)
    assert m.allocate_slots(a, 9) is not None
    a.num_computed_tokens = 9
    for _ in range(2):
        a.append_output_token_ids(1)
        assert m.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    tables = m.get_block_ids("a")
    m.free(a)
    hits, tokens, boundary = m.get_computed_blocks(
        make("b", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 1, 1], 2)
    )
    return tables, hits.get_block_ids(), (tokens, boundary)


# what vLLM 0.34.0 itself gives on this trace (test_the_release_gives_the_same_trace below)
TABLES = ([1, 2, 3, 4, 5, 21], [0, 0, 0, 0, 10, 22], [0, 0, 0, 14, 15, 23], [0, 0, 0, 0, 20, 8])
HIT = ([1, 2, 3, 4, 5], [0, 0, 0, 0, 10], [0, 0, 0, 14, 15], [0, 0, 0, 0, 20])


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_three_further_groups_trace(cls: Manager) -> None:
    """Blocks wholly before each group's span become null (window of 3: four blocks, of 5:
    three, chunk of 4: four) and the freed ones are found again as a null-padded hit."""
    tables, hit, counts = three_groups(cls)
    assert tables == TABLES and hit == HIT and counts == (10, 0)


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_chunked_local_frees_whole_chunks_only(cls: Manager) -> None:
    m = cls(12, 2, 16, **variant_keywords("r0.34"), attention_groups=(("chunked_local", 4),))
    a = Request("a", [1, 2, 3, 4, 5], 2)
    assert m.allocate_slots(a, 5) is not None
    a.num_computed_tokens = 5
    a.append_output_token_ids(7)
    assert m.allocate_slots(a, 1) is not None  # 5 processed: the first chunk (blocks 0-1) goes
    assert m.get_block_ids("a")[1][:2] == [0, 0]
    assert read_prefix_cache(m).groups[0][0] == (("a", (0, 0, 6)),)


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"attention_groups": (("ring", 2),)}, "unknown KV cache group kind 'ring'"),
        ({"attention_groups": (("chunked_local", 0),)}, "needs an int size >= 1"),
        ({"attention_groups": (("sliding_window",),)}, r"is \(kind, tokens\)"),
        ({"sliding_window": 3, "attention_groups": (("sliding_window", 3),)}, "two equal"),
        (
            {"use_eagle": True, "attention_groups": (("chunked_local", 4),)},
            "does not support EAGLE",
        ),
        ({"sliding_window": -1}, "sliding_window must be an int >= 0"),
        ({"attention_groups": (("mamba", 2),)}, "a mamba group has no span"),
    ],
)
def test_bad_groups_are_rejected(cls: Manager, keywords: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        cls(8, 2, 16, **keywords)


def test_impl_and_spec_agree_with_further_groups_fixed() -> None:
    comp = components.get("vllm-prefix-cache")
    for groups in ((("chunked_local", 3),), (("sliding_window", 4), ("chunked_local", 2))):
        r = comp.fuzz(
            ImplManager, "impl", 3000, 5, variant="r0.34", use_eagle=False,
            sliding_window=2, attention_groups=groups,
        )  # fmt: skip
        assert r.passed, r.failure
        assert r.coverage["rule:schedule_running"] > 0


def mamba_trace(cls: Manager, make: Callable[..., Any] = Request) -> list[Any]:
    """Full attention and a Mamba group: a 9-token prompt and three decodes (one state block per
    step, the one before freed a step later), a second request whose hit was cached in the
    same step (refused until ``new_step_starts``), then admitted."""
    m = cls(16, 2, 16, **variant_keywords("r0.34"), attention_groups=(("mamba", 0),))
    a = make("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], 2)
    assert m.allocate_slots(a, 9) is not None
    a.num_computed_tokens = 9
    seen = [m.get_block_ids("a")]
    for _ in range(3):
        a.append_output_token_ids(1)
        assert m.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
        seen.append(m.get_block_ids("a"))
    b = make("b", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 1, 1, 3], 2)
    hits, n, _ = m.get_computed_blocks(b)
    seen += [(hits.get_block_ids(), n), m.allocate_slots(b, b.num_tokens - n, n, hits)]
    m.new_step_starts()
    hits, n, _ = m.get_computed_blocks(b)
    seen.append(m.allocate_slots(b, b.num_tokens - n, n, hits).get_block_ids())
    m.free(a)
    return [*seen, m.get_block_ids("b")]


# what vLLM 0.34.0 itself gives (test_the_release_gives_the_same_mamba_trace below)
MAMBA = [
    ([1, 2, 3, 4, 5], [0, 0, 0, 0, 6]),
    ([1, 2, 3, 4, 5], [0, 0, 0, 0, 6]),
    ([1, 2, 3, 4, 5, 7], [0, 0, 0, 0, 6, 8]),
    ([1, 2, 3, 4, 5, 7], [0, 0, 0, 0, 0, 8]),
    (([1, 2, 3, 4, 5, 7], [0, 0, 0, 0, 0, 8]), 12),
    None,  # the hit's state was cached in this step
    ([9], [10]),
    ([1, 2, 3, 4, 5, 7, 9], [0, 0, 0, 0, 0, 8, 10]),
]


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_mamba_trace(cls: Manager) -> None:
    assert mamba_trace(cls) == MAMBA


def mamba_overdraw(cls: Manager, make: Callable[..., Any] = Request) -> tuple[str, Any]:
    """0.34's Mamba count takes one block for the step while its external-token adoption takes
    blocks up to the computed tokens: with a tight pool the allocation raises after adopting."""
    m = cls(5, 2, 16, **variant_keywords("r0.34"), attention_groups=(("mamba", 0),))
    c = make("c", [5, 5, 5, 5, 5, 5], 2)
    with pytest.raises(ValueError, match="Cannot get 1 free blocks"):
        m.allocate_slots(c, 1, 0, None, 0, 4)
    return str(read_prefix_cache(m).num_free_blocks), m.get_block_ids("c")


@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_mamba_external_tokens_overdraw_the_pool(cls: Manager) -> None:
    assert mamba_overdraw(cls) == ("0", ([1, 2, 4], [0, 3]))


# ----------------------------------------------------------------------------- the release
def _wheel() -> Path | None:
    given = os.environ.get(corpus.WHEEL_ENV["vllm"], "")
    return Path(given) if given and Path(given).is_file() else None


needs_release = pytest.mark.skipif(
    _wheel() is None, reason=f"set {corpus.WHEEL_ENV['vllm']} to a vllm-0.34.0 wheel"
)


@needs_release
def test_the_release_gives_the_same_trace() -> None:
    tree = trees.tree_for("vllm", str(_wheel()))
    _, cls = load_target("vllm-prefix-cache", f"vllm@{tree}")
    tables, hit, counts = three_groups(cls, cls.kvspec_request)  # type: ignore[attr-defined]
    assert tables == TABLES and hit == HIT and counts == (10, 0)


@needs_release
def test_the_release_conforms_with_chunked_and_three_groups() -> None:
    tree = trees.tree_for("vllm", str(_wheel()))
    _, cls = load_target("vllm-prefix-cache", f"vllm@{tree}")
    comp = components.get("vllm-prefix-cache")
    for groups in ((("chunked_local", 3),), (("sliding_window", 4), ("chunked_local", 2))):
        r = comp.fuzz(
            cls, "vllm", 3000, 5, variant="r0.34", inputs="well-formed", use_eagle=False,
            sliding_window=2, attention_groups=groups,
        )  # fmt: skip
        assert r.passed, r.failure


@needs_release
def test_the_release_gives_the_same_mamba_trace_and_overdraw() -> None:
    tree = trees.tree_for("vllm", str(_wheel()))
    _, cls = load_target("vllm-prefix-cache", f"vllm@{tree}")
    assert mamba_trace(cls, cls.kvspec_request) == MAMBA  # type: ignore[attr-defined]
    assert mamba_overdraw(cls, cls.kvspec_request) == ("0", ([1, 2, 4], [0, 3]))  # type: ignore[attr-defined]


@needs_release
def test_the_release_conforms_with_mamba() -> None:
    tree = trees.tree_for("vllm", str(_wheel()))
    _, cls = load_target("vllm-prefix-cache", f"vllm@{tree}")
    comp = components.get("vllm-prefix-cache")
    for window, eagle in ((0, False), (3, True)):
        r = comp.fuzz(
            cls, "vllm", 3000, 5, variant="r0.34", inputs="well-formed", use_eagle=eagle,
            sliding_window=window, attention_groups=(("mamba", 0),),
        )  # fmt: skip
        assert r.passed, r.failure
        assert r.coverage["rule:new_step"] > 0


# ----------------------------------------------------------------------------- the explorer
@pytest.mark.parametrize("cls", MANAGERS, ids=["spec", "impl"])
def test_the_explorer_clone_copies_every_group_s_own_containers(cls: Manager) -> None:
    """The explorer's fast clone copies each group manager's containers (shared ones let one
    explored branch change another's state: a Mamba group's, found on the real release, issue 26)
    and may copy them shallowly: after a workload with every group kind, none holds a block."""
    from proofs.explorer.model_prefix_cache import PrefixCacheBounds, PrefixCacheModel, _containers
    from proofs.explorer.set_clone import deep_key

    bounds = PrefixCacheBounds(variant="r0.34", window=3, chunk=2, mamba=True, blocks=8,
                               block_size=2, max_model_len=5)  # fmt: skip
    model = PrefixCacheModel("vllm-prefix-cache", cls, "t", bounds)
    h = model.initial()[1]
    h.add_request("r0", [0, 1])
    assert h.schedule("r0", 64, 0) is not None
    copy = model.clone(h)
    assert deep_key(copy.m) == deep_key(h.m)
    managers = h.m.coordinator.single_type_managers
    mamba = managers[-1]
    for old, new in zip(managers, copy.m.coordinator.single_type_managers, strict=True):
        for name in _containers(old):
            value = getattr(old, name)
            assert getattr(new, name) is not value, name
            items = value.values() if isinstance(value, dict) else value
            assert not any(hasattr(x, "ref_cnt") for x in items), f"{name} holds blocks"
    assert "cached_blocks_this_step" in _containers(mamba)
    copy.new_step_starts()
    assert mamba.cached_blocks_this_step  # the original's step state is untouched
