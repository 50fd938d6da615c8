"""``kvspec bench radix``: SGLang's radix cache, spec (a dict of paths) against impl (a tree).

A warm cache of ``n`` cached prompts (a shared 16-token prefix, then 8 tokens of their own), and
three calls the scheduler makes on it, for ``n`` of 128 to 2,048 prompts:

* ``match_hit`` — ``match_prefix`` of one cached prompt (the path refreshed);
* ``insert_cached`` — ``insert`` of a cached prompt (found whole, nothing added);
* ``evict_one`` — ``evict`` of one slot: the least recently used leaf goes (restored untimed).

Both sides run the same fixture, interleaved round by round; the result is ``baseline / impl`` per
case. Before timing, both sides run the call once and must end in equal snapshots, or the bench
raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from impl.sglang.radix_cache import RadixCache as ImplCache
from spec.sglang.radix_cache import RadixCache as SpecCache
from spec.sglang.radix_cache import read_radix_cache

PREFIX, LEAF = 16, 8
CASES = (128, 512, 2048)
QUICK_CASES = (128, 512)
SCENARIOS = ("match_hit", "insert_cached", "evict_one")


class _Fixture:
    """A cache holding ``n`` prompts, and the call under test."""

    def __init__(self, cls: Callable[..., Any], n: int, scenario: str) -> None:
        self.c = cls(n * LEAF + 2 * (PREFIX + LEAF), page_size=1)
        self.alloc = self.c.token_to_kv_pool_allocator
        self.scenario = scenario
        self.prompts = [[*range(PREFIX), 1000 + i, *([i] * (LEAF - 1))] for i in range(n)]
        for p in self.prompts:
            self._insert(p)
        self.target = self.prompts[n // 2]
        self.next_evicted = 0

    def _insert(self, prompt: list[int]) -> None:
        slots = self.alloc.alloc(len(prompt))
        found = self.c.insert(prompt, slots)
        if found:
            self.alloc.free(slots[:found])  # the tree keeps its own copy of the shared part

    def run(self) -> None:
        if self.scenario == "match_hit":
            self.c.match_prefix(self.target)
        elif self.scenario == "insert_cached":
            self.c.insert(self.target, list(range(1, len(self.target) + 1)))
        else:
            self.c.evict(1)

    def restore(self) -> None:
        if self.scenario == "evict_one":  # the evicted leaf back, now the most recently used
            self._insert(self.prompts[self.next_evicted])
            self.next_evicted = (self.next_evicted + 1) % len(self.prompts)


def _check_same(n: int, scenario: str) -> None:
    spec, impl = _Fixture(SpecCache, n, scenario), _Fixture(ImplCache, n, scenario)
    for _ in range(3):
        for side in (spec, impl):
            side.run()
            side.restore()
    if read_radix_cache(spec.c) != read_radix_cache(impl.c):
        raise AssertionError(f"spec and impl differ after {scenario} on {n} prompts")


Timer = Callable[..., dict[str, float]]


def bench_radix(
    rounds: int, quick: bool, interleaved: Timer
) -> Iterator[tuple[dict[str, Any], float, float]]:
    """Rows ``(case, baseline_us, impl_us)``, timed by ``interleaved`` (``kvspec.bench``'s)."""
    for scenario in SCENARIOS:
        for n in QUICK_CASES if quick else CASES:
            _check_same(min(n, 64), scenario)
            sides = {
                "baseline": _Fixture(SpecCache, n, scenario),
                "impl": _Fixture(ImplCache, n, scenario),
            }
            med = interleaved(rounds, sides, "run", (), lambda f: f.restore())
            yield {"scenario": scenario, "prompts": n}, med["baseline"], med["impl"]
