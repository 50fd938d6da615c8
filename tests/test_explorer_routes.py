"""Where ``--workers`` may rely on a pair being one thing: a portable search routes each pair by
:meth:`Model.route`, which must be one value at every arrival at the pair; and the scheduler
explorer's copies share only the requests found forgotten, which never change again."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pytest

from impl.infinilm.scheduler import Scheduler as ImplScheduler
from kvspec import components
from proofs.explorer import SchedulerBounds, SchedulerModel, explore

BM = "infinilm-block-manager"


def _arrivals(
    model: Any, monkeypatch: pytest.MonkeyPatch, seen: Callable[[Any, Any, Any], Hashable]
) -> dict[int, set[Hashable]]:
    """``seen(snap, spec, target)`` at every arrival at each pair of a serial search."""
    from proofs.explorer import engine

    out: dict[int, set[Hashable]] = {}
    pair = engine.Expander.pair

    def recording(self: Any, spec: Any, target: Any, snap: Any, *rest: Any) -> int:
        pid: int = pair(self, spec, target, snap, *rest)
        out.setdefault(pid, set()).add(seen(snap, spec, target))
        return pid

    monkeypatch.setattr(engine.Expander, "pair", recording)
    assert explore(model).complete
    monkeypatch.undo()
    return out


@pytest.mark.parametrize(
    ("component", "variant", "options"),
    [
        (BM, "", {"pages": 2, "tokens": 2}),
        ("infinilm-scheduler", "legacy", {"pages": 3, "requests": 2, "prompt_tokens": 2}),
        ("vllm-arc", "no_fallback", {"capacity": 2, "keys": 3}),
        ("vllm-lru", "v2", {"capacity": 3, "keys": 4}),
        ("vllm-prefix-cache", "classic", {"blocks": 2}),
        ("sglang-radix-cache", "lru", {"pages": 2}),
    ],
)
def test_a_pairs_route_is_the_same_at_every_arrival(
    component: str, variant: str, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A portable ``--workers`` search (Ray actors) sends every state of a pair to the owner its
    route names, so the route must be a function of the pair key: one pair reached with two
    routes would be explored by two workers. The scheduler is the case that needs its own: a
    forgotten request's final row is cut from its key, so one pair is reached with different raw
    snapshots."""
    from proofs.explorer import entry

    comp = components.get(component)
    assert comp.explorer is not None
    bounds = entry.make_bounds(
        components.resolve(comp.explorer.bounds), variant, options, component=component
    )
    model_cls = components.resolve(comp.explorer.model)
    model = model_cls(component, components.resolve(comp.impl), "impl", bounds, comp.fixed_options)
    routes = _arrivals(model, monkeypatch, model.route)
    assert len(routes) > 20
    assert all(len(r) == 1 for r in routes.values())
    if component == "infinilm-scheduler":  # (not vacuous: some pair is reached twice over)
        snaps = _arrivals(model, monkeypatch, lambda snap, spec, target: snap)
        assert any(len(r) > 1 for r in snaps.values())


def test_scheduler_harness_clone_shares_only_forgotten_requests() -> None:
    """A request found forgotten (finished, nothing but the harness's dict refers to it) never
    changes again, so copies share it; every other request is copied, and the copy's later
    events leave the shared one as it was."""
    from proofs.explorer.set_clone import clone, deep_key
    from spec.infinilm.snapshot import request_row

    model = SchedulerModel("infinilm-scheduler", ImplScheduler, "impl", SchedulerBounds())
    h = model.initial()[1]
    h.add_request("r0", [0], 1, False, 0, False, False)
    h.step([])  # r0 reaches max_tokens: finished and dropped by the scheduler
    h.add_request("r1", [0, 0], 2, False, 0, False, False)
    assert model.forgotten(h) == {"r0"}
    fast = model.clone(h)
    assert fast.requests["r0"] is h.requests["r0"]
    assert fast.requests["r1"] is not h.requests["r1"]
    for name in vars(h):
        if name not in ("config", "types"):
            assert deep_key(getattr(clone(h), name)) == deep_key(getattr(fast, name)), name
    row = request_row("r0", h.requests["r0"])
    fast.step([])
    fast.step([])
    assert request_row("r0", fast.requests["r0"]) == row
    assert model.forgotten(fast) >= {"r0"}  # the finding travels with the copy
