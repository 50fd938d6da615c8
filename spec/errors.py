"""The specific exceptions of kvspec's models.

Each class also derives from the builtin exception that the upstream engine raises for the same
condition (``ValueError``, ``IndexError``, ``RuntimeError``, ``AssertionError``), so a caller written
against upstream keeps working and the lockstep checker can compare a kvspec model with an upstream
class by *kind* (see :func:`exception_kind`).
"""

from __future__ import annotations


class KvspecError(Exception):
    """Base class of every exception a kvspec model raises on purpose."""


class InvalidArgument(KvspecError, ValueError):
    """A count, length or range argument is out of its domain (negative, too large, start > end)."""


class InvalidPageId(KvspecError, IndexError):
    """A page id that the operation would read is not an int in ``[0, num_blocks)``.

    Upstream raises ``IndexError`` for ids >= N and silently aliases negative ids to the end of the
    pool (Python indexing); kvspec rejects both.
    """


class TableTooShort(KvspecError, IndexError):
    """A block table has no page for a token index the operation must map to a slot."""


class PageStateError(KvspecError, RuntimeError):
    """A page is not in the state the operation requires (wrong ref count, hashed, not in use)."""


class RehashError(PageStateError):
    """Publishing would change a page's prefix hash (a page is hashed at most once per lifetime)."""


class OutOfBlocksError(KvspecError, RuntimeError):
    """No free page is left even after reclamation ("No available cache blocks")."""


class DoubleFreeError(KvspecError, AssertionError):
    """A page is released while its reference count is already 0 (upstream: an ``assert``)."""


class UnknownBlockId(KvspecError, AssertionError):
    """A GPU block id outside the pool (vLLM's ``evict_blocks`` asserts ``block_id < N``)."""


class RequestStateError(KvspecError, AssertionError):
    """A request is not in the state a KV-cache manager call needs (vLLM asserts), e.g. prefix
    hits handed to a request that already holds blocks."""


class OffloadStateError(KvspecError, AssertionError):
    """An offload key is absent, or its block is not in the state the operation needs.

    vLLM's offload manager asserts (``assert block is not None``, ``assert block.is_ready``,
    ``assert block.ref_cnt > 0``), so the kind is ``AssertionError``.
    """


class LockRefUnderflow(KvspecError, AssertionError):
    """A radix-tree lock released more often than it was taken (SGLang's ``dec_lock_ref`` has no
    check: the node's ``lock_ref`` goes to -1 and it becomes evictable; docs/sglang.md §3)."""


class NestedFreeGroup(KvspecError, AssertionError):
    """SGLang's ``free_group_begin`` while a free group is already open (upstream asserts "free
    groups cannot be nested" before changing anything; docs/sglang.md §1.4)."""


class UnknownNode(KvspecError, KeyError):
    """A radix-tree node handle that is not (or no longer) in the tree."""


# Builtin kinds, most specific first; a model's exception is compared with a target's by kind.
_KINDS: tuple[type[BaseException], ...] = (
    KeyError,
    IndexError,
    ValueError,
    AssertionError,
    RuntimeError,
    TypeError,
    AttributeError,
    ArithmeticError,
)


def exception_kind(exc: BaseException) -> str:
    """The builtin family of ``exc`` (e.g. ``"ValueError"``), used to compare across codebases."""
    for kind in _KINDS:
        if isinstance(exc, kind):
            return kind.__name__
    return type(exc).__name__
