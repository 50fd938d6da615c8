"""Exact clones of explored states: CPython's set tables copied verbatim.

**Set iteration order is state.** Eviction order is the iteration order of the used set
(docs/infinilm.md §9.3), and a CPython set's order depends on its history (deleted entries
leave dummies, the table grows with the fill): ``copy``, ``deepcopy`` and ``pickle`` rebuild a
set and can change its future order. States are therefore cloned with every set's hash table
copied verbatim (:func:`clone_set`, self-tested against the interpreter before a search:
:func:`cloner_ready`), and the state key holds the tables of the spec's sets (and of the
target's: a target whose tables differ is explored separately). ``distinct_snapshots`` counts
states up to those tables.
"""

from __future__ import annotations

import copy
import ctypes
import enum
import io
import pickle
import sys
import types
from collections import OrderedDict, deque
from typing import Any

# ---------------------------------------------------------------------------- exact clones
# Eviction order is the iteration order of a Python set (docs/infinilm.md §9.3), and a set's
# iteration order depends on its history (deleted entries leave dummies; the table grows with the
# fill): ``copy``, ``deepcopy`` and ``pickle`` rebuild a set and may change its order. So states are
# cloned with every set's hash table copied verbatim (CPython layout, self-tested before use), and
# the state key includes the tables of the spec's sets: a snapshot alone does not determine the
# future order.


class _SetEntry(ctypes.Structure):
    _fields_ = (("key", ctypes.c_void_p), ("hash", ctypes.c_ssize_t))


class _SetObject(ctypes.Structure):  # CPython's PySetObject (3.11-3.13, default build)
    _fields_ = (
        ("ob_refcnt", ctypes.c_ssize_t),
        ("ob_type", ctypes.c_void_p),
        ("fill", ctypes.c_ssize_t),
        ("used", ctypes.c_ssize_t),
        ("mask", ctypes.c_ssize_t),
        ("table", ctypes.c_void_p),
        ("hash", ctypes.c_ssize_t),
        ("finger", ctypes.c_ssize_t),
        ("smalltable", _SetEntry * 8),
    )


_SMALLTABLE = _SetObject.smalltable.offset
_malloc = ctypes.pythonapi.PyMem_Malloc
_malloc.restype, _malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
_free = ctypes.pythonapi.PyMem_Free
_free.restype, _free.argtypes = None, (ctypes.c_void_p,)


class ExplorerUnsupported(RuntimeError):
    """The explorer cannot copy these states exactly: this interpreter's sets (it needs CPython
    3.11+), or an object of a type that cannot be made without its own constructor (a lock)."""


def _memory() -> tuple[Any, Any]:
    """This process's memory as bytes and as 8-byte words (a buffer over address 0): reading a
    set's header and table through it costs an index and a slice, not a ctypes call (``None``
    where ctypes cannot map it: every read then goes through ``from_address``)."""
    try:
        raw = memoryview((ctypes.c_char * (1 << 62)).from_address(0)).cast("B")
        return raw, raw.cast("q")
    except (TypeError, ValueError, OverflowError, MemoryError):  # pragma: no cover
        return None, None


_MEM, _WORD = _memory()
# word offsets of the fields read (every field of PySetObject is 8 bytes and objects are aligned)
_FILL, _USED, _MASK, _TABLE, _FINGER = (
    getattr(_SetObject, name).offset >> 3 for name in ("fill", "used", "mask", "table", "finger")
)


def clone_set(s: set[Any]) -> set[Any]:
    """A copy of ``s`` with the same hash table: same slots, dummies, size and fill, hence the
    same iteration order now and after any further sequence of adds and removes."""
    copied = s.copy()  # holds a reference to every element, as the verbatim table needs
    words = _WORD
    if words is None:
        return _copy_table(s, copied)
    at = id(s) >> 3
    fill, mask, finger = words[at + _FILL], words[at + _MASK], words[at + _FINGER]
    if fill == words[at + _USED] and mask == 7 and finger == 0:
        return copied  # no dummies, small table: the copy is laid out slot for slot already
    to = id(copied)
    small = to + _SMALLTABLE
    to >>= 3
    if mask != 7 or words[to + _TABLE] != small:
        return _copy_table(s, copied)  # a large table needs its own allocation
    table = words[at + _TABLE]
    _MEM[small : small + 128] = _MEM[table : table + 128]
    words[to + _FILL] = fill
    words[to + _FINGER] = finger
    return copied


def _copy_table(s: set[Any], copied: set[Any]) -> set[Any]:
    """:func:`clone_set` through ctypes structures (any table size)."""
    src = _SetObject.from_address(id(s))
    if src.fill == src.used and src.mask == 7 and src.finger == 0:
        return copied
    return _install_table(copied, src.table, src.mask, src.fill, src.finger)


def _install_table(made: set[Any], entries: int, mask: int, fill: int, finger: int) -> set[Any]:
    """Give ``made`` (which already holds a reference to every element) the table of ``mask + 1``
    entries at address ``entries``, with that fill and finger: in its small table if it fits, in
    a table of its own otherwise."""
    dst = _SetObject.from_address(id(made))
    small = id(made) + _SMALLTABLE
    size = (mask + 1) * ctypes.sizeof(_SetEntry)
    if mask == 7:
        if dst.table != small:
            _free(dst.table)
            dst.table = small
        ctypes.memmove(small, entries, size)
    else:
        table = _malloc(size)
        if not table:
            raise MemoryError("cannot allocate a set table")
        ctypes.memmove(table, entries, size)
        if dst.table != small:
            _free(dst.table)
        dst.table = table
    dst.mask, dst.fill, dst.finger = mask, fill, finger
    return made


def _dummy_address() -> int:
    """The address of CPython's dummy key (what a removed entry points to)."""
    s = {1 << 40}
    s.discard(1 << 40)
    src = _SetObject.from_address(id(s))
    entries = (_SetEntry * (src.mask + 1)).from_address(src.table)
    found = [e.key for e in entries if e.hash == -1]
    if len(found) != 1 or not found[0]:
        raise ExplorerUnsupported("this interpreter's sets mark removed entries another way")
    return int(found[0])


_DUMMY: list[int] = []


def _dummy() -> int:
    if not _DUMMY:
        _DUMMY.append(_dummy_address())
    return _DUMMY[0]


# (fill, mask, finger, slots of the elements in iteration order, slots of the dummies, elements,
# the elements' hashes as the table holds them)
SetState = tuple[int, int, int, tuple[int, ...], tuple[int, ...], tuple[Any, ...], tuple[int, ...]]


class NotPortable(ValueError):
    """A set that cannot be rebuilt here: an element hashes differently in this process (a hash
    by identity, or another hash seed) than where its table was written."""


def set_state(s: set[Any]) -> SetState:
    """A description of ``s``'s hash table that names no address: fill, size, the ``pop`` finger,
    which slot each element and each dummy sits in. :func:`rebuild_set` turns it back into a set
    with that table, in this process or in a forked copy of it (element hashes must agree: the
    same interpreter and hash seed)."""
    dummy = _dummy()
    words = _WORD
    if words is not None:
        at = id(s) >> 3
        fill, mask, finger = words[at + _FILL], words[at + _MASK], words[at + _FINGER]
        first = words[at + _TABLE] >> 3
        entries = words[first : first + 2 * (mask + 1)]  # (key, hash) pairs
    else:
        src = _SetObject.from_address(id(s))
        fill, mask, finger = src.fill, src.mask, src.finger
        entries = memoryview(ctypes.string_at(src.table, (mask + 1) * 16)).cast("q")
    keys = entries[::2]
    slots = tuple(i for i, k in enumerate(keys) if k and k != dummy)
    dummies = tuple(i for i, k in enumerate(keys) if k == dummy)
    hashes = tuple(entries[2 * i + 1] for i in slots)
    return fill, mask, finger, slots, dummies, tuple(s), hashes  # iteration = slot order


def rebuild_set(state: SetState) -> set[Any]:
    """The set :func:`set_state` described: the same elements in the same slots, the same dummies,
    fill, size and finger, hence the same iteration order now and after any later operations."""
    fill, mask, finger, slots, dummies, elements, hashes = state
    dummy = _dummy()
    table = bytearray((mask + 1) * 16)
    words = memoryview(table).cast("q")
    for slot, element, expected in zip(slots, elements, hashes, strict=True):
        h = hash(element)
        if h != expected:  # its slot was chosen by another hash: this table would lose it
            raise NotPortable(f"a {type(element).__name__} element hashes differently here")
        words[2 * slot], words[2 * slot + 1] = id(element), h
    for slot in dummies:
        words[2 * slot], words[2 * slot + 1] = dummy, -1
    made = set(elements)  # holds a reference to each element, as the table does
    entries = ctypes.addressof((ctypes.c_char * len(table)).from_buffer(table))
    return _install_table(made, entries, mask, fill, finger)


def _interned(s: str) -> bool:
    """``s`` is the interpreter's interned copy of its value (CPython's ``state.interned`` bits of
    the string header, read without interning anything; self-tested by :func:`cloner_ready`)."""
    return _MEM is not None and bool(_MEM[id(s) + _STR_STATE] & 3)


_STR_STATE = 32  # PyASCIIObject: ob_refcnt, ob_type, length, hash, then the state bit field


class _ExactPickler(pickle.Pickler):
    """A pickler that writes every set as its table (:func:`set_state`), aliasing kept, and every
    interned string as a reference to the interned object (a plain load makes a new string, and a
    set that later holds it would hold another address than the sender's copy: another key)."""

    def persistent_id(self, obj: Any) -> Any:
        t = type(obj)
        # (a persistent id is pickled through this method too: its tags hold no strings)
        if t is set:
            return (id(obj), set_state(obj))
        if t is str and _interned(obj):
            return obj.encode("utf-8", "surrogatepass")
        return None


class _ExactUnpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO) -> None:
        super().__init__(data)
        self.sets: dict[int, set[Any]] = {}

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is bytes:
            return sys.intern(pid.decode("utf-8", "surrogatepass"))
        ident, state = pid
        found = self.sets.get(ident)
        if found is None:
            found = self.sets[ident] = rebuild_set(state)
        return found


def exact_dumps(obj: Any) -> bytes:
    """``obj``'s object graph as bytes, every set with its hash table: :func:`exact_loads` in this
    process or a forked copy of it gives an exact copy (what ``pickle`` alone does not: it rebuilds
    sets by insertion). Raises whatever ``pickle`` raises for an object it cannot write."""
    out = io.BytesIO()
    _ExactPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


def exact_loads(data: bytes) -> Any:
    """The object graph :func:`exact_dumps` wrote, sets laid out as they were."""
    return _ExactUnpickler(io.BytesIO(data)).load()


def set_layout(s: set[Any]) -> tuple[int, bytes]:
    """The hash table of ``s`` (fill and raw entries) — equal layouts iterate equally forever.
    Entries hold element addresses: exact for small ints and shared elements (over-distinguishing
    otherwise, which costs states, never soundness)."""
    words = _WORD
    if words is not None:
        at = id(s) >> 3
        table = words[at + _TABLE]
        return words[at + _FILL], _MEM[table : table + ((words[at + _MASK] + 1) << 4)].tobytes()
    src = _SetObject.from_address(id(s))
    return src.fill, ctypes.string_at(src.table, (src.mask + 1) * ctypes.sizeof(_SetEntry))


_ATOMIC: set[type] = {
    int,
    float,
    bool,
    str,
    bytes,
    complex,
    type(None),
    type,
    range,
    frozenset,
    types.FunctionType,
    types.BuiltinFunctionType,
}
_STRATEGY: dict[type, Any] = {}
_MISSING = object()


def _slot_names(t: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in t.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return tuple(names)


def _strategy(t: type) -> Any:
    if t in _ATOMIC or issubclass(t, enum.Enum | type):
        _ATOMIC.add(t)
        return "atom"
    if t in (list, dict, set, tuple, deque, OrderedDict, types.MethodType):
        return t.__name__
    plain = (
        getattr(t, "__deepcopy__", None) is None
        and t.__reduce_ex__ is object.__reduce_ex__
        and getattr(t, "__getstate__", object.__getstate__) is object.__getstate__
        and t.__new__ is object.__new__
    )
    if plain:
        return (_slot_names(t), t.__dictoffset__ != 0)
    return "deepcopy"


def clone(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """An exact, independent copy of ``obj``'s object graph (aliasing kept, sets laid out as in
    the original; set elements and functions are shared, as they are hashable values)."""
    memo = {} if memo is None else memo
    t = type(obj)
    how = _STRATEGY.get(t)
    if how is None:
        how = _STRATEGY[t] = _strategy(t)
    if how == "atom":
        return obj
    found = memo.get(id(obj))
    if found is not None:
        return found
    new: Any
    if how == "list" or how == "deque":
        new = memo[id(obj)] = obj.copy()
        for i, x in enumerate(new):
            if type(x) not in _ATOMIC:
                new[i] = clone(x, memo)
    elif how == "dict":
        new = memo[id(obj)] = obj.copy()
        for k, v in new.items():
            if type(v) not in _ATOMIC:
                new[k] = clone(v, memo)
    elif how == "OrderedDict":
        new = memo[id(obj)] = OrderedDict()
        for k, v in obj.items():
            new[k] = v if type(v) in _ATOMIC else clone(v, memo)
    elif how == "set":
        new = memo[id(obj)] = clone_set(obj)
    elif how == "tuple":
        new = memo[id(obj)] = tuple(x if type(x) in _ATOMIC else clone(x, memo) for x in obj)
    elif how == "method":
        new = memo[id(obj)] = types.MethodType(obj.__func__, clone(obj.__self__, memo))
    elif how == "deepcopy":  # a type with its own copy protocol (sets inside it lose layout)
        new = copy.deepcopy(obj, memo)
    else:
        slots, has_dict = how
        try:
            new = memo[id(obj)] = object.__new__(t)
        except TypeError:  # (a lock, a thread handle: a C type object.__new__ refuses)
            raise ExplorerUnsupported(
                f"the explorer copies every state exactly and cannot copy a "
                f"{t.__module__}.{t.__qualname__} the objects hold (a lock, e.g. in a janus "
                "queue): check, fuzz and audit drive such a target without copies"
            ) from None
        if has_dict:
            state = obj.__dict__.copy()
            for k, v in state.items():
                if type(v) not in _ATOMIC:
                    state[k] = clone(v, memo)
            new.__dict__.update(state)
        for name in slots:
            v = getattr(obj, name, _MISSING)
            if v is not _MISSING:
                object.__setattr__(new, name, v if type(v) in _ATOMIC else clone(v, memo))
    return new


def _self_test() -> None:
    """Clone sets with every kind of history and check that the clones iterate like the
    originals under the same later operations; ``ExplorerUnsupported`` otherwise."""
    import random
    import sys

    if sys.implementation.name != "cpython" or sys.getsizeof(set()) != 216:
        raise ExplorerUnsupported("the explorer clones CPython sets verbatim; run it on CPython")
    rng = random.Random(0)
    for _ in range(300):
        universe = range(rng.choice((4, 8, 13, 40)))
        s: set[int] = set()
        for _ in range(rng.randint(0, 40)):
            (s.add if rng.random() < 0.6 else s.discard)(rng.choice(universe))
        c = clone(s)
        for _ in range(40):
            x, add = rng.choice(universe), rng.random() < 0.6
            for y in (s, c):
                (y.add if add else y.discard)(x)
            if list(s) != list(c) or set_layout(s) != set_layout(c):
                raise ExplorerUnsupported("this interpreter's set layout is not the one expected")
    built = "".join(["kvspec", "-probe-", str(rng.random())])  # a new string: not interned
    if _MEM is not None and (_interned(built) or not _interned(sys.intern("kvspec-probe"))):
        raise ExplorerUnsupported("this interpreter's string headers are not the ones expected")


_TESTED: list[bool] = []
_EXACT: list[bool] = []


def exact_ready() -> bool:
    """Whether :func:`exact_dumps` and :func:`exact_loads` copy sets exactly on this interpreter
    (checked once: sets with every kind of history go through a round trip and must keep their
    tables and iterate like the originals after the same later operations). ``--workers`` sends
    paths instead of copies where this is false."""
    if not _EXACT:
        _EXACT.append(_exact_round_trips())
    return _EXACT[0]


def _exact_round_trips() -> bool:
    import random

    rng = random.Random(1)
    try:
        for _ in range(100):
            universe = range(rng.choice((4, 8, 40)))
            s: set[int] = set()
            for _ in range(rng.randint(0, 40)):
                (s.add if rng.random() < 0.6 else s.discard)(rng.choice(universe))
            copied: set[int] = exact_loads(exact_dumps(s))
            if set_layout(copied) != set_layout(s):
                return False
            for _ in range(20):
                x, add = rng.choice(universe), rng.random() < 0.6
                for y in (s, copied):
                    (y.add if add else y.discard)(x)
                if list(s) != list(copied):
                    return False
    except Exception:  # an interpreter whose objects this cannot read: paths, as before
        return False
    return True


def cloner_ready() -> None:
    if not _TESTED:
        _self_test()
        _TESTED.append(True)


def deep_key(obj: Any, memo: dict[int, int] | None = None) -> Any:
    """A hashable value of ``obj``'s whole object graph (types, attributes in order, sets as their
    hash tables, shared objects as back-references; objects with their own copy protocol by
    identity): what the tests compare to show that a fast cloner copies what :func:`clone` does."""
    memo = {} if memo is None else memo
    t = type(obj)
    how = _STRATEGY.get(t)
    if how is None:
        how = _STRATEGY[t] = _strategy(t)
    if how == "atom":
        return obj
    seen = memo.get(id(obj))
    if seen is not None:
        return ("ref", seen)
    memo[id(obj)] = len(memo)
    if how in ("list", "deque", "tuple"):
        return (how, tuple(deep_key(x, memo) for x in obj))
    if how in ("dict", "OrderedDict"):
        return (how, tuple((k, deep_key(v, memo)) for k, v in obj.items()))
    if how == "set":
        return ("set", set_layout(obj))
    if how == "method":
        return ("method", obj.__func__, deep_key(obj.__self__, memo))
    if how == "deepcopy":
        return ("opaque", id(obj))  # no generic reading: never equal to another object's key
    slots, has_dict = how
    fields = tuple((k, deep_key(v, memo)) for k, v in obj.__dict__.items()) if has_dict else ()
    values = tuple(deep_key(getattr(obj, n, _MISSING), memo) for n in slots)
    return (t, fields, values)
