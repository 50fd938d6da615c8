"""Plain-data views of the reclamation kernels, for CrossHair.

The reclamation kernels read page metadata through a page table (the block managers pass their
``blocks`` list: nothing is copied on the reclaim hot path), but CrossHair reasons best about plain
lists and ints, and ``crosshair diffbehavior`` needs both functions of a pair to take the same
arguments. So each adapter here takes the used set as a plain list of reference counts in
iteration order (:func:`used_set` gives the pages distinct ids that are *not* in iteration order),
builds the table, and computes what the optimised kernel's caller maintains (the candidate count)
the way the invariant says it must be. The adapters carry the reclamation contracts that
``crosshair check`` verifies.

diffbehavior ignores preconditions, so both sides refuse the same impossible inputs (a negative
free-deque length or request) with the same exception: equal exceptions are equal behaviour, and
the search for differences stays in the domain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from impl.infinilm.kernels import bounded_reclaim
from spec.infinilm.kernels import PageTable, legacy_reclaim

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
    """A bounded-reclamation kernel on the used set of :func:`used_set`, given the candidate
    count its caller keeps (``len(used) - num_referenced``). Planted variants reuse it."""

    def run(refs: list[int], num_free: int, num_required: int) -> Result:
        in_domain(num_free, num_required)
        used, table = used_set(refs)
        candidates = sum(1 for ref in refs if ref == 0)
        return kernel(used, table, num_free, num_required, candidates)

    run.__name__ = run.__qualname__ = f"{kernel.__name__.lstrip('_')}_on_pages"
    return run


_bounded_on_pages = on_pages(bounded_reclaim)


def bounded_reclaim_on_pages(refs: list[int], num_free: int, num_required: int) -> Result:
    """:func:`impl.infinilm.kernels.bounded_reclaim` on the used set of :func:`used_set`, given
    the candidate count its caller keeps. Together the postconditions pin down legacy's result:
    a prefix of the candidates, at least one if any (quirk A), all of them on failure (quirk B),
    never more than the deficit.

    pre: num_free >= 0 and num_required >= 0
    post: __return__[0] == candidates_of(refs)[: len(__return__[0])]
    post: __return__[1] == (num_free + len(__return__[0]) >= num_required)
    post: (len(__return__[0]) >= 1) == (len(candidates_of(refs)) >= 1)
    post: __return__[1] or __return__[0] == candidates_of(refs)
    post: len(__return__[0]) <= max(num_required - num_free, 1)
    """
    return _bounded_on_pages(refs, num_free, num_required)
