"""Run Hypothesis properties on the CrossHair backend and report each verdict as JSON.

``python -m proofs.crosshair_backend FILE.py::test_name …`` imports each property and calls it
(a ``@given`` test runs its whole search when called). The verdict comes from what the call does,
not from any printed text, so it holds whichever Hypothesis release wrote the report and needs no
pytest (``kvspec verify`` runs on a plain install):

* ``passed`` — the search ended without a failure;
* ``falsified`` — the property's own assertion failed (``AssertionError``); ``detail`` is the
  falsifying example Hypothesis attached to the exception as a note, when there is one;
* ``error`` — anything else (a Hypothesis error such as an unsatisfiable strategy or a flaky test,
  the backend giving up, an import error): inconclusive, never a pass.

One JSON document on stdout: ``{"results": [{"target", "status", "detail"}, …]}``; exit 0 once the
document is written.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _load(target: str) -> Callable[[], Any]:
    """``path/to/module.py::function`` (a pytest-style node id) → the function."""
    path, sep, name = target.partition("::")
    if not sep or not name or not path.endswith(".py"):
        raise ValueError(f"expected FILE.py::function, got {target!r}")
    module = ".".join(Path(path).with_suffix("").parts)
    fn: Callable[[], Any] = getattr(importlib.import_module(module), name)
    return fn


def _note(exc: BaseException) -> str:
    notes = [n for n in getattr(exc, "__notes__", ()) if n.strip()]
    falsifying = [n for n in notes if n.lstrip().startswith(("Falsifying", "Failing"))]
    return " ".join((falsifying or notes or [repr(exc)])[0].split())


def run_one(target: str) -> dict[str, str]:
    try:
        prop = _load(target)
    except Exception as exc:  # an import or name error is a broken check, not a finding
        return {"target": target, "status": "error", "detail": f"{type(exc).__name__}: {exc}"}
    try:
        prop()
    except AssertionError as exc:
        return {"target": target, "status": "falsified", "detail": _note(exc)}
    except Exception as exc:  # every other outcome is inconclusive
        return {"target": target, "status": "error", "detail": f"{type(exc).__name__}: {exc}"}
    return {"target": target, "status": "passed", "detail": ""}


def main(argv: Sequence[str] | None = None) -> int:
    targets = list(sys.argv[1:] if argv is None else argv)
    results = [run_one(t) for t in targets]
    sys.stdout.write(json.dumps({"results": results}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
