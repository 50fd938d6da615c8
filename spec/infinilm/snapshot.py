"""The one snapshot reader for block managers.

It reads only the upstream attribute names (``num_blocks``, ``block_size``, ``blocks[i].ref_count``,
``blocks[i].hash``, ``free_block_ids``, ``used_block_ids``, ``hash_to_block_ids``), so the same reader
fits kvspec's spec, kvspec's impl and an upstream InfiniLM ``BlockManager``.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, NamedTuple

_REF = attrgetter("ref_count")
_HASH = attrgetter("hash")


class BlockManagerSnapshot(NamedTuple):
    """Every observable of a block manager, as a comparable value.

    Orders are part of the value: ``free_block_ids`` is the free deque left to right (allocation
    order), ``used_block_ids`` the used set's *iteration* order (eviction order), and each prefix
    index entry lists its pages in set iteration order (which copy a lookup pins). A NamedTuple,
    not a dataclass: checkers build two per call, and tuple construction is the cheapest.
    """

    num_blocks: int
    block_size: int
    free_block_ids: tuple[int, ...]
    used_block_ids: tuple[int, ...]
    ref_counts: tuple[int, ...]
    hashes: tuple[bytes, ...]
    hash_to_block_ids: tuple[tuple[bytes, tuple[int, ...]], ...]  # sorted by hash

    def differing_fields(self, other: BlockManagerSnapshot) -> list[str]:
        """Names of the fields whose values differ between ``self`` and ``other``."""
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (hashes as hex)."""
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "free_block_ids": list(self.free_block_ids),
            "used_block_ids": list(self.used_block_ids),
            "ref_counts": list(self.ref_counts),
            "hashes": [h.hex() for h in self.hashes],
            "hash_to_block_ids": {h.hex(): list(ids) for h, ids in self.hash_to_block_ids},
        }


def read_block_manager(bm: Any) -> BlockManagerSnapshot:
    """Snapshot any object with the upstream ``BlockManager`` attribute names."""
    blocks = bm.blocks
    return BlockManagerSnapshot(
        num_blocks=bm.num_blocks,
        block_size=bm.block_size,
        free_block_ids=tuple(bm.free_block_ids),
        used_block_ids=tuple(bm.used_block_ids),
        ref_counts=tuple(b.ref_count for b in blocks),
        hashes=tuple(b.hash for b in blocks),
        hash_to_block_ids=tuple(sorted((h, tuple(ids)) for h, ids in bm.hash_to_block_ids.items())),
    )
