"""``kvspec bench prefix-cache``: vLLM's GPU prefix cache, spec (lists) against impl (linked list).

Three scheduler calls on a pool whose free queue is full of cached blocks (a warm cache), each on
pools of 1,024 to 32,768 blocks of 16 tokens:

* ``admit_hits`` — admitting a request whose first 32 blocks hit cached blocks still in the free
  queue (``get_computed_blocks`` + ``allocate_slots``): 32 removals from the middle of the queue;
* ``free_request`` — freeing a request of 64 blocks (``free``: unhashed tail to the head, cached
  blocks to the tail);
* ``allocate_evicting`` — a new request taking 64 blocks from the head of the queue, evicting their
  cache entries (``allocate_slots``);
* ``admit_hits_hybrid`` — ``admit_hits`` with vLLM 0.34's hybrid coordinator: full attention, a
  sliding window of 64 tokens and chunked local attention in chunks of 256 (the warm request
  holds a third of the pool in each group; the hit is null-padded in the two further groups).

Both sides run the same fixture, interleaved round by round (``kvspec.bench`` times it with its
``_interleaved`` and makes the rows); the result is ``baseline / impl`` per case. Before timing,
both sides do the call once and must end in equal snapshots, or the bench raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from impl.vllm.kv_cache_manager import KVCacheManager as ImplManager
from spec.vllm.kv_cache_manager import KVCacheManager as SpecManager
from spec.vllm.kv_cache_manager import Request, read_prefix_cache

BLOCK = 16
CASES = (1024, 8192, 32768)
QUICK_CASES = (1024, 8192)
HITS = 32
BLOCKS = 64
HYBRID: dict[str, Any] = {
    "hit_length_clamp": True,
    "common_prefix_blocks": "removed",
    "sliding_window": 4 * BLOCK,
    "attention_groups": (("chunked_local", 16 * BLOCK),),
}


class _Fixture:
    """A manager whose free queue holds every block, cached (a request of ``n - 1`` blocks was
    computed and freed), and the call under test."""

    def __init__(self, cls: Callable[..., Any], n: int, scenario: str) -> None:
        hybrid = scenario == "admit_hits_hybrid"
        self.m = cls(n, BLOCK, n * BLOCK, **(HYBRID if hybrid else {}))
        self.scenario = "admit_hits" if hybrid else scenario
        warm_blocks = (n - 1) // 3 if hybrid else n - 1
        self.warm = Request("warm", list(range(warm_blocks * BLOCK)), BLOCK)
        self._admit(self.warm)
        self.m.free(self.warm)
        base = self.warm.prompt_token_ids
        self.hits = Request("hits", [*base[: HITS * BLOCK], -1, -2], BLOCK)
        self.fresh = Request("fresh", [-3] * (BLOCKS * BLOCK), BLOCK)
        self.fresh.skip_reading_prefix_cache = True  # a miss every round, not a hit from the last
        self.held = Request("held", [*base[: (BLOCKS - 1) * BLOCK], -4], BLOCK)
        if scenario == "free_request":
            self._admit(self.held)

    def _admit(self, req: Request) -> None:
        req.num_computed_tokens = 0
        hits, n, _ = self.m.get_computed_blocks(req)
        assert self.m.allocate_slots(req, req.num_tokens - n, n, hits) is not None
        req.num_computed_tokens = req.num_tokens

    def run(self) -> None:
        if self.scenario == "admit_hits":
            self._admit(self.hits)
        elif self.scenario == "free_request":
            self.m.free(self.held)
        else:
            self._admit(self.fresh)

    def restore(self) -> None:
        if self.scenario == "admit_hits":
            self.m.free(self.hits)
        elif self.scenario == "free_request":
            self._admit(self.held)
        else:
            self.m.free(self.fresh)


def _check_same(n: int, scenario: str) -> None:
    spec, impl = _Fixture(SpecManager, n, scenario), _Fixture(ImplManager, n, scenario)
    for side in (spec, impl):
        side.run()
    if read_prefix_cache(spec.m) != read_prefix_cache(impl.m):
        raise AssertionError(f"spec and impl differ after {scenario} on {n} blocks")


Timer = Callable[..., dict[str, float]]


def bench_prefix_cache(
    rounds: int, quick: bool, interleaved: Timer
) -> Iterator[tuple[dict[str, Any], float, float]]:
    """Rows ``(case, baseline_us, impl_us)``, timed by ``interleaved`` (``kvspec.bench``'s
    ``_interleaved``: the sides alternate within every round, the median of each is kept)."""
    for scenario in ("admit_hits", "free_request", "allocate_evicting", "admit_hits_hybrid"):
        for n in QUICK_CASES if quick else CASES:
            _check_same(min(n, 1024), scenario)
            sides = {
                "baseline": _Fixture(SpecManager, n, scenario),
                "impl": _Fixture(ImplManager, n, scenario),
            }
            med = interleaved(rounds, sides, "run", (), lambda f: f.restore())
            yield {"scenario": scenario, "num_blocks": n}, med["baseline"], med["impl"]
