"""Plain-data views of the reclamation kernels, for CrossHair.

The reclamation kernels read page metadata through a page table (the block managers pass their
``blocks`` list: nothing is copied on the reclaim hot path), but CrossHair reasons best about plain
lists and ints, and ``crosshair diffbehavior`` needs both functions of a pair to take the same
arguments. So each adapter here takes the used set as a plain list of reference counts in
iteration order (:func:`used_set` gives the pages distinct ids that are *not* in iteration order),
builds the table, and computes what the optimised kernel's caller maintains (the candidate count)
the way the invariant says it must be. The production side is not a kernel: the impl runs PR #578's
bounded scan inlined in ``try_free_blocks`` (a kernel call per reclaim cost a third of the ratio),
so :func:`try_free_blocks_on_pages` runs that method itself on a model block manager built from
the same plain data. The adapters carry the reclamation contracts that ``crosshair check``
verifies.

vLLM's ARC victim selection gets the same treatment at the end of the module (``arc_*``: eligibility
flags for lists, the selection for every ``n`` for diffbehavior, contracts on the impl kernel).

diffbehavior ignores preconditions, so both sides refuse the same impossible inputs (a negative
free-deque length or request) with the same exception: equal exceptions are equal behaviour, and
the search for differences stays in the domain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from impl.infinilm.block_manager import Block as ImplBlock
from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from impl.vllm.arc import one_pass_victims
from spec.infinilm.kernels import PageTable, legacy_reclaim
from spec.vllm.arc import rescan_victims

Result = tuple[list[int], bool]
BoundedKernel = Callable[[Iterable[int], PageTable, int, int, int], Result]


@dataclass
class Page:
    """A page's metadata as the kernels read it."""

    ref_count: int


def used_set(refs: list[int]) -> tuple[list[int], list[Page]]:
    """The used set in iteration order and the page table, from the ref counts of the used pages
    in iteration order. The i-th page visited has id ``n - 1 - i``: iteration order is not id
    order (``identical_eviction_order``: eviction follows the set, never the ids), and the ids are
    distinct, as in a set. The kernels never compare ids, so these labels lose no generality."""
    n = len(refs)
    table = [Page(0)] * n
    used = []
    for i, ref in enumerate(refs):
        page = n - 1 - i
        table[page] = Page(ref)
        used.append(page)
    return used, table


def candidates_of(refs: list[int]) -> list[int]:
    """The unreferenced pages of the used set, in iteration order."""
    used, table = used_set(refs)
    return [page for page in used if table[page].ref_count == 0]


def in_domain(num_free: int, num_required: int) -> None:
    """Raise ``ValueError`` outside the domain (the same on both sides of a pair)."""
    if num_free < 0 or num_required < 0:
        raise ValueError(f"outside the domain: num_free={num_free}, num_required={num_required}")


def legacy_reclaim_on_pages(refs: list[int], num_free: int, num_required: int) -> Result:
    """:func:`spec.infinilm.kernels.legacy_reclaim` on the used set of :func:`used_set`.

    pre: num_free >= 0 and num_required >= 0
    post: __return__[0] == candidates_of(refs)[: len(__return__[0])]
    post: __return__[1] == (num_free + len(__return__[0]) >= num_required)
    """
    in_domain(num_free, num_required)
    used, table = used_set(refs)
    return legacy_reclaim(used, table, num_free, num_required)


def on_pages(kernel: BoundedKernel) -> Callable[[list[int], int, int], Result]:
    """A bounded-reclamation kernel (a function of the used set, the page table, the free count,
    the request and the candidate count the caller keeps, ``len(used) - num_referenced``) on the
    used set of :func:`used_set`. The planted variants of :mod:`proofs.crosshair_mutants` are such
    kernels: each is the production method's scan with one hazard."""

    def run(refs: list[int], num_free: int, num_required: int) -> Result:
        in_domain(num_free, num_required)
        used, table = used_set(refs)
        candidates = sum(1 for ref in refs if ref == 0)
        return kernel(used, table, num_free, num_required, candidates)

    run.__name__ = run.__qualname__ = f"{kernel.__name__.lstrip('_')}_on_pages"
    return run


# Two prefix hashes, alternating over the pages: evicting a page removes it from a hash's page set
# and, when it was the last, the hash from the index, so both branches of the eviction run.
_HASHES = (b"\x01", b"\x02")


Method = Callable[[Any, int], bool]


class FreePages:
    """The free deque as ``try_free_blocks`` uses it (its length, ``append``), holding a symbolic
    number of pages without listing them: a real deque of ``num_free`` pages would make CrossHair
    pick a concrete ``num_free`` on every path and spend its budget on free-list lengths."""

    def __init__(self, num_free: int) -> None:
        self.num_free = num_free
        self.appended: list[int] = []

    def __len__(self) -> int:
        return self.num_free + len(self.appended)

    def append(self, page: int) -> None:
        self.appended.append(page)


def _model(refs: list[int], num_free: int) -> Any:
    """A production block manager whose state is the used set of :func:`used_set`: a page table of
    the impl's own ``Block`` objects, every used page indexed under one of two hashes, ``num_free``
    free pages (:class:`FreePages`) and the ``num_referenced`` counter as its invariant says. Built
    attribute by attribute (the constructor would allocate the pages itself); the used set is a
    list, so that its iteration order is the one ``refs`` gives."""
    used, _ = used_set(refs)
    blocks = [ImplBlock(page) for page in range(len(refs))]
    index: dict[bytes, set[int]] = {}
    for page, ref in zip(used, refs, strict=True):
        blocks[page].ref_count = ref
        blocks[page].hash = _HASHES[page % 2]
        index.setdefault(blocks[page].hash, set()).add(page)
    model: Any = object.__new__(ImplBlockManager)
    model.num_blocks = len(refs)
    model.blocks = blocks
    model.used_block_ids = used
    model.free_block_ids = FreePages(num_free)
    model.hash_to_block_ids = index
    model.num_referenced = sum(1 for ref in refs if ref != 0)  # used - referenced = candidates
    return model


def method_on_pages(method: Method) -> Callable[[list[int], int, int], Result]:
    """A ``try_free_blocks`` method run on the model of :func:`_model`: the evicted pages in the
    order they reached the free deque, and the method's return value. Planted variants of the
    production method (:mod:`proofs.crosshair_mutants`) reuse it."""

    def run(refs: list[int], num_free: int, num_required: int) -> Result:
        in_domain(num_free, num_required)
        model = _model(refs, num_free)
        enough = method(model, num_required)
        return model.free_block_ids.appended, enough

    return run


_method_on_pages = method_on_pages(ImplBlockManager.try_free_blocks)


def try_free_blocks_on_pages(refs: list[int], num_free: int, num_required: int) -> Result:
    """The production method :meth:`impl.infinilm.block_manager.BlockManager.try_free_blocks`
    itself (PR #578's bounded scan, inlined there for speed) on the model block manager of
    :func:`_model`. Together the postconditions pin down legacy's result: a prefix of the
    candidates, at least one if any (quirk A), all of them on failure (quirk B), never more than
    the deficit.

    pre: num_free >= 0 and num_required >= 0
    post: __return__[0] == candidates_of(refs)[: len(__return__[0])]
    post: __return__[1] == (num_free + len(__return__[0]) >= num_required)
    post: (len(__return__[0]) >= 1) == (len(candidates_of(refs)) >= 1)
    post: __return__[1] or __return__[0] == candidates_of(refs)
    post: len(__return__[0]) <= max(num_required - num_free, 1)
    """
    return _method_on_pages(refs, num_free, num_required)


# ----------------------------------------------------------------------------- ARC victim selection
# vLLM's ARC ``evict`` (docs/vllm.md §2.3) delegates selection to a pure kernel:
# ``spec.vllm.arc.rescan_victims`` (variant A: rescan from the LRU end for every victim) and
# ``impl.vllm.arc.one_pass_victims`` (#50992: one monotonic iterator per list; the #55461 fallback
# reuses the T1 iterator). The adapters run them on plain data: T1 and T2 as lists of eligibility
# flags from the LRU end (the block *is* its flag and ``eligible(key, block)`` reads it, so
# eligibility is fixed during the call, as ``evict`` guarantees), T1 keys ``0, 1, ...`` and T2 keys
# ``-1, -2, ...`` (distinct, as in the policy), ``t1_size = len(t1)`` (ineligible entries
# included, as ``evict`` passes it) and ``target`` standing for ``int(target_t1_size)``. ``evict``
# keeps the target in ``[0, cache_capacity]``, and the capacity bounds nothing the kernels read (a
# target above ``len(t1)`` behaves as ``len(t1) + 1``), so the domain is ``target >= 0``,
# ``n >= 0``. A selection is ``[(key, from_t1), ...]`` in selection order, or ``None``.

Picks = list[tuple[int, bool]] | None
VictimKernel = Callable[..., list[tuple[Any, Any, bool]] | None]
OnFlags = Callable[[list[bool], list[bool], int, int], Picks]


def arc_lists(
    t1: list[bool], t2: list[bool]
) -> tuple[list[tuple[int, bool]], list[tuple[int, bool]]]:
    """T1 and T2 as ``(key, block)`` entries from the LRU end, with distinct keys."""
    return [(i, flag) for i, flag in enumerate(t1)], [(-1 - i, flag) for i, flag in enumerate(t2)]


def arc_in_domain(target: int, n: int) -> None:
    """Raise ``ValueError`` outside the domain (the same on both sides of a pair). The message
    names no value: formatting a symbolic int realizes it, one wasted path per value."""
    if target < 0 or n < 0:
        raise ValueError("outside the domain: target < 0 or n < 0")


def _eligible(key: int, block: bool) -> bool:
    return block


def arc_on_flags(kernel: VictimKernel, t1_fallback: bool) -> OnFlags:
    """A victim-selection kernel (``rescan_victims``'s signature) on eligibility flags. Planted
    variants reuse it."""

    def run(t1: list[bool], t2: list[bool], target: int, n: int) -> Picks:
        arc_in_domain(target, n)
        t1_entries, t2_entries = arc_lists(t1, t2)
        picks = kernel(t1_entries, t2_entries, len(t1), target, n, t1_fallback, _eligible)
        return None if picks is None else [(key, from_t1) for key, _, from_t1 in picks]

    suffix = "_with_fallback" if t1_fallback else ""
    run.__name__ = run.__qualname__ = f"{kernel.__name__.lstrip('_')}_on_flags{suffix}"
    return run


def every_n(on_flags: OnFlags) -> Callable[[list[bool], int, int], list[Picks]]:
    """The pair's diffbehavior signature: the selection for *every* ``n`` that matters, from T1
    ``entries[:split]`` and T2 ``entries[split:]``.

    Why no symbolic ``n``: a kernel's selection for ``n`` is the first ``n`` steps of one loop
    that ``n`` only bounds, and the rescan fails by step ``len(entries) + 1``, so two such kernels
    differ for some ``n`` iff they differ for some ``n <= len(entries) + 1``. CrossHair explores a
    symbolic ``n`` poorly (most paths take ``n = 0``): the restarted-iterator bug needs three
    victims and took ~160 uninteresting iterations to find with ``(t1, t2, target, n)``, 25 here.
    One list and a split, rather than two lists, for the same reason (measured)."""

    def run(entries: list[bool], split: int, target: int) -> list[Picks]:
        # Spelled so that CrossHair's likelier branch (it favours the negation of ``a > b``,
        # 3:1) stays in the domain; ``not 0 <= split`` sent most paths into the error branch.
        if target < 0 or split < 0 or split > len(entries):
            raise ValueError("outside the domain: target < 0 or split not in [0, len(entries)]")
        t1, t2 = entries[:split], entries[split:]
        return [on_flags(t1, t2, target, n) for n in range(len(entries) + 2)]

    run.__name__ = run.__qualname__ = on_flags.__name__.replace("_on_flags", "_every_n")
    return run


def arc_well_formed(t1: list[bool], t2: list[bool], n: int, picks: Picks) -> bool:
    """``picks`` is ``None`` or ``n`` distinct eligible entries, each flagged with its own list,
    each list's picks in LRU order (what the rescan can return, short of its interleaving)."""
    if picks is None:
        return True
    from_t1 = [key for key, in_t1 in picks if in_t1]
    from_t2 = [-1 - key for key, in_t1 in picks if not in_t1]
    return (
        len(picks) == n
        and all(0 <= i < len(t1) and t1[i] for i in from_t1)
        and all(0 <= i < len(t2) and t2[i] for i in from_t2)
        and from_t1 == sorted(set(from_t1))
        and from_t2 == sorted(set(from_t2))
    )


_rescan = every_n(arc_on_flags(rescan_victims, False))
_rescan_fallback = every_n(arc_on_flags(rescan_victims, True))
_one_pass = every_n(arc_on_flags(one_pass_victims, False))
_one_pass_fallback = every_n(arc_on_flags(one_pass_victims, True))
_one_pass_on_flags = arc_on_flags(one_pass_victims, False)
_one_pass_on_flags_fallback = arc_on_flags(one_pass_victims, True)


def arc_rescan_every_n(entries: list[bool], split: int, target: int) -> list[Picks]:
    """:func:`spec.vllm.arc.rescan_victims` (no T1 fallback, the #50992 state) for every ``n``."""
    return _rescan(entries, split, target)


def arc_rescan_every_n_with_fallback(entries: list[bool], split: int, target: int) -> list[Picks]:
    """:func:`spec.vllm.arc.rescan_victims` with the #55461 T1 fallback, for every ``n``."""
    return _rescan_fallback(entries, split, target)


def arc_one_pass_every_n(entries: list[bool], split: int, target: int) -> list[Picks]:
    """:func:`impl.vllm.arc.one_pass_victims` (no T1 fallback) for every ``n``."""
    return _one_pass(entries, split, target)


def arc_one_pass_every_n_with_fallback(entries: list[bool], split: int, target: int) -> list[Picks]:
    """:func:`impl.vllm.arc.one_pass_victims` with the #55461 T1 fallback, for every ``n``."""
    return _one_pass_fallback(entries, split, target)


def arc_one_pass_on_flags(t1: list[bool], t2: list[bool], target: int, n: int) -> Picks:
    """:func:`impl.vllm.arc.one_pass_victims` without the T1 fallback: well formed, and it fails
    only if T2 holds fewer than ``n`` eligible entries.

    pre: target >= 0 and n >= 0
    post: arc_well_formed(t1, t2, n, __return__)
    post: __return__ is not None or n > sum(t2)
    """
    return _one_pass_on_flags(t1, t2, target, n)


def arc_one_pass_on_flags_with_fallback(
    t1: list[bool], t2: list[bool], target: int, n: int
) -> Picks:
    """:func:`impl.vllm.arc.one_pass_victims` with the #55461 T1 fallback: well formed, and it
    fails exactly when the two lists hold fewer than ``n`` eligible entries (O6).

    pre: target >= 0 and n >= 0
    post: arc_well_formed(t1, t2, n, __return__)
    post: (__return__ is None) == (n > sum(t1) + sum(t2))
    """
    return _one_pass_on_flags_fallback(t1, t2, target, n)
