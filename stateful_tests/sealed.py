"""Objects a target cannot reach, so cannot change: the fuzzer reads them once, not every call.

A Python object is changed only through a reference to it. :func:`sealed` says that nothing but
its owner (one dict entry) refers to an object, nor to any mutable object its attributes hold,
and that no weak reference to it exists: then code that is handed neither the object nor its
owner cannot reach it, and the object keeps the value it has now until the owner's code hands it
out again. A checker that reads such an object after every call may reuse what it read.

Only what is plainly immutable or checked to be referenced once counts: ints, strings, bytes,
floats, ``None``, enum members (shared, immutable), tuples of those; lists, sets and dicts of
those; and plain objects (with a ``__dict__``) of those. Anything else (a ``__slots__`` request
class, a nested container, a shared list) is not sealed, and is read after every call as before.
Reference counts are exact in CPython (:func:`sys.getrefcount`); a test pins the counts this
module expects on the running interpreter.
"""

from __future__ import annotations

import sys
import weakref
from enum import Enum
from typing import Any

_ATOMS = (int, str, bytes, float, bool, type(None))
_CONTAINERS = (list, set, dict)
_getrefcount = sys.getrefcount
_weakrefs = weakref.getweakrefcount

# A value held by exactly one strong reference of its owner, as sys.getrefcount sees it here: the
# owner's, the local name's, and getrefcount's own argument.
OWNED_ONCE = 3


def _atom(value: Any) -> bool:
    return type(value) in _ATOMS or isinstance(value, Enum)


def _immutable(value: Any) -> bool:
    return _atom(value) or (type(value) is tuple and all(map(_atom, value)))


def _all_immutable(values: Any) -> bool:
    """``all(map(_immutable, values))``: all plain atoms (the common case) decided by their types
    in one C-level pass; anything else item by item."""
    return all(map(_IS_ATOM_TYPE, map(type, values))) or all(map(_immutable, values))


_ATOM_TYPES = frozenset(_ATOMS)
_IS_ATOM_TYPE = _ATOM_TYPES.__contains__


def _sealed_value(value: Any) -> bool:
    """An attribute value that only its owner's ``__dict__`` refers to (or an immutable one)."""
    kind = type(value)
    if kind in _ATOM_TYPES:
        return True
    if kind in _CONTAINERS:  # (tested first: a container is never immutable)
        if _getrefcount(value) > OWNED_ONCE + 1:  # + the caller's loop name
            return False
        if kind is dict:
            return all(map(_atom, value)) and _all_immutable(value.values())
        return _all_immutable(value)
    if _immutable(value):  # an enum member, a tuple of atoms
        return True
    inner = getattr(value, "__dict__", None)
    if type(inner) is not dict or isinstance(value, type):
        return False
    if _getrefcount(value) > OWNED_ONCE + 1 or _weakrefs(value):
        return False
    return _all_immutable(inner.values())


def sealed(owner: dict[Any, Any], key: Any) -> bool:
    """``owner[key]`` is referenced only by ``owner``, has no weak references, and each of its
    attributes is immutable or itself referenced only by the object (see the module docstring)."""
    obj = owner[key]
    if _getrefcount(obj) > OWNED_ONCE or _weakrefs(obj):
        return False
    attributes = getattr(obj, "__dict__", None)
    if type(attributes) is not dict:
        return False
    for value in attributes.values():
        if type(value) not in _ATOM_TYPES and not _sealed_value(value):
            return False
    return True
