"""Planting a bug in code the impl inlines: the real method's source with one substitution.

A mutant is normally a subclass overriding a helper. Where the impl inlines that helper for speed
(``try_free_blocks``' eviction, the prefill loop's admission check), overriding the helper no longer
changes what runs, so the bug is planted in the method itself: its current source, one text
substitution, compiled in its own module's namespace. The substitution must match exactly once, so
an edit of the method cannot silently turn the planted variant into the real one (the mutant then
fails to build, loudly, instead of surviving).
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any


def method_with(function: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """``function`` recompiled with the single occurrence of ``old`` in its source replaced by
    ``new`` (a multi-line ``new`` takes the indent of the line ``old`` is on).

    Raises ``RuntimeError`` if ``old`` is not a substring of exactly one place in the source.
    """
    source = textwrap.dedent(inspect.getsource(function))
    if source.count(old) != 1:
        raise RuntimeError(
            f"planted {function.__qualname__}: {old!r} occurs {source.count(old)} times, not once"
        )
    line = next(line for line in source.splitlines() if old in line)
    new = new.replace("\n", "\n" + line[: len(line) - len(line.lstrip())])
    namespace = dict(function.__globals__)
    code = compile(source.replace(old, new), f"<{function.__qualname__} with {new!r}>", "exec")
    exec(code, namespace)
    planted: Callable[..., Any] = namespace[function.__name__]
    planted.__qualname__ = function.__qualname__
    return planted
