"""``kvspec soak`` (seed tasks over local processes or Ray) and ``kvspec explore --address`` (the
explorer's workers as Ray actors, in the search's portable mode).

Cheap by design: soaks of a few thousand calls on forked local processes; the portable explorer
on threads of this process; one test on a local Ray instance, skipped where ray is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvspec import components, distributed
from kvspec.cli import main
from proofs.explorer import entry, search
from proofs.explorer.parallel import stable_digest

BM = "infinilm-block-manager"
LRU = "vllm-lru"
SOAK_KEYS = {"component", "target", "workers", "ops", "seconds", "ops_per_second", "per_worker",
             "coverage", "divergences"}  # fmt: skip
MUTANT = "lifo_free_list"  # found within the first task (fuzzer: a few calls)


def soak(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(["soak", *argv, "--json"])
    out, _ = capsys.readouterr()
    document = json.loads(out)
    assert isinstance(document, dict)
    return rc, document


def test_soak_makes_the_same_calls_on_one_or_two_workers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    args = (BM, "--backend", "processes", "--ops", "6000", "--chunk", "1500")
    rc1, one = soak(capsys, *args, "--workers", "1")
    rc2, two = soak(capsys, *args, "--workers", "2")
    assert rc1 == rc2 == 0
    assert one.keys() >= SOAK_KEYS and two.keys() >= SOAK_KEYS
    assert (one["workers"], two["workers"]) == (1, 2)
    assert one["ops"] == two["ops"] >= 6000
    assert one["tasks"] == two["tasks"] == 4 and one["seeds"] == two["seeds"] == [0, 3]
    assert one["coverage"] == two["coverage"] and one["coverage_keys"] > 20
    assert one["divergences"] == two["divergences"] == 0 and two["counterexample"] is None
    assert one["stopped_by"] == "ops" and one["backend"] == "processes"
    for doc in (one, two):
        assert sum(w["ops"] for w in doc["per_worker"]) == doc["ops"]
        assert 1 <= len(doc["per_worker"]) <= doc["workers"]
        assert doc["timeline"][-1]["ops"] == doc["ops"]
        assert doc["calls_per_cpu_second"] > 0


def test_soak_of_a_planted_bug_exits_1_with_a_shrunk_replayable_trace(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    args = (BM, "--backend", "processes", "--workers", "2", "--ops", "40000", "--chunk", "2000")
    rc, raw = soak(capsys, *args, "--target", f"mutant:{MUTANT}", "--no-shrink")
    assert rc == 1 and raw["divergences"] >= 1 and raw["stopped_by"] == "divergence"
    rc, doc = soak(capsys, *args, "--target", f"mutant:{MUTANT}")
    assert rc == 1
    cx = doc["counterexample"]
    assert cx["check"] and cx["seed"] == doc["seeds"][0] + cx["task"]
    assert len(cx["steps"]) < len(raw["counterexample"]["steps"])  # shrunk
    assert doc["ops"] < 40000  # stopped at the divergence, not at the budget
    trace = json.loads(Path(cx["trace_file"]).read_text())
    assert trace["soak"]["seed"] == cx["seed"] and trace["target"] == f"mutant:{MUTANT}"
    assert main(["replay", cx["trace_file"], "--json"]) == 1
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["counterexample"]["check"] == cx["check"]
    # the seed that found it: kvspec fuzz from that seed finds it again
    fuzz = cx["fuzz"].split()[2:]  # "kvspec fuzz COMPONENT …"
    assert main(["fuzz", *fuzz, "--no-shrink", "--json"]) == 1
    capsys.readouterr()


def test_soak_variant_all_cycles_every_variant(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    variants = components.get(LRU).variants
    ops = str(300 * len(variants))
    rc, doc = soak(capsys, LRU, "--backend", "processes", "--workers", "2", "--ops", ops,
                   "--chunk", "300", "--variant", "all")  # fmt: skip
    assert rc == 0
    assert doc["variants"] == sorted(variants)


def test_soak_duration_is_a_budget(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = soak(capsys, BM, "--backend", "processes", "--workers", "1", "--duration", "0.5",
                   "--chunk", "500")  # fmt: skip
    assert rc == 0 and doc["stopped_by"] == "duration" and doc["ops"] > 0


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([BM, "--variant", "all"], "has no variants"),
        ([BM, "--backend", "processes", "--address", "auto"], "needs the Ray backend"),
        ([BM, "--ops", "0"], "--ops must be at least 1"),
        ([BM, "--workers", "0"], "--workers must be at least 1"),
        ([BM, "--duration", "-1"], "--duration must be positive"),
        ([BM, "--target", "mutant:nope"], "no mutant"),
    ],
)
def test_soak_cannot_run_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    assert main(["soak", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and words in err


def test_soak_of_a_target_that_cannot_be_built_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The workers' failure reaches the driver, which stops them and says why in one line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text(
        "from impl.infinilm.block_manager import BlockManager\n\n\n"
        "class Bad(BlockManager):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise RuntimeError('no pages today')\n"
    )
    argv = ["soak", BM, "--backend", "processes", "--workers", "2", "--target", "bad.py:Bad"]
    assert main([*argv, "--ops", "1000"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no pages today" in err and len(err.strip().splitlines()) == 1


def test_soak_without_ray_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    assert not distributed.ray_available()
    assert main(["soak", BM, "--backend", "ray"]) == 2
    assert "kvspec[distributed]" in capsys.readouterr().err


# ----------------------------------------------------------------------------- portable explorer
def test_stable_digest_is_the_same_in_another_interpreter() -> None:
    """hash(None) is an address on CPython 3.11 and str hashes are salted: the digest uses
    neither (the portable explorer routes states by it)."""
    from spec.infinilm.request import RequestStatus

    value = (None, "req-1", b"\x01\x02", RequestStatus.RUNNING, frozenset({"a", "b"}), (1, -2))
    code = (
        "from proofs.explorer.parallel import stable_digest\n"
        "from spec.infinilm.request import RequestStatus\n"
        "print(stable_digest((None, 'req-1', b'\\x01\\x02', RequestStatus.RUNNING, "
        "frozenset({'b', 'a'}), (1, -2))))"
    )
    root = Path(__file__).resolve().parents[1]
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert int(other.stdout) == stable_digest(value)
    assert stable_digest((None,)) != stable_digest(("None",)) != stable_digest((b"None",))


class ThreadBackend:
    """The Ray backend's actor (kvspec.distributed.ExplorerActor) on threads of this process, in
    the search's portable mode: what a cluster runs, without the cluster."""

    portable = True

    def start(self, n: int, worker: Any) -> None:
        self.actors = [distributed.ExplorerActor(worker, i, n) for i in range(n)]
        self.pending: dict[int, Any] = {}

    def send(self, i: int, message: Any) -> None:
        if message[0] == "stop":
            self.actors[i].stop()
        else:
            self.pending[i] = message

    def receive(self, i: int) -> Any:
        return self.actors[i].call(self.pending.pop(i))

    def close(self) -> None:
        pass


def _explore(name: str, variant: str, workers: int, backend: Any = None) -> Any:
    comp = components.get(name)
    model_cls = components.resolve(comp.explorer.model)
    bounds = entry.make_bounds(
        components.resolve(comp.explorer.bounds), variant, comp.explorer.verify_scope,
        component=name,
    )  # fmt: skip
    model = model_cls(name, components.resolve(comp.impl), "impl", bounds, comp.fixed_options)
    return search.explore(model, workers=workers, backend=backend)


@pytest.mark.parametrize(("name", "variant"), [(BM, ""), (LRU, "v2")])
def test_portable_search_finds_exactly_the_serial_states(name: str, variant: str) -> None:
    serial = _explore(name, variant, 1)
    portable = _explore(name, variant, 3, ThreadBackend)
    assert serial.complete and portable.complete
    for field in ("distinct_states", "distinct_snapshots", "edges", "max_depth"):
        assert getattr(portable, field) == getattr(serial, field), field
    assert portable.states_per_depth == serial.states_per_depth
    assert sum(serial.states_per_depth) == serial.distinct_states


def test_portable_search_reports_a_planted_bug_at_the_serial_depth() -> None:
    comp = components.get(BM)
    mutant = next(m for m in comp.planted if m.name == MUTANT)
    model_cls = components.resolve(comp.explorer.model)
    bounds_cls = components.resolve(comp.explorer.bounds)
    found = []
    for workers, backend in ((1, None), (2, ThreadBackend)):
        bounds = entry.make_bounds(bounds_cls, "", comp.explorer.verify_scope, component=BM)
        model = model_cls(BM, mutant.cls, f"mutant:{MUTANT}", bounds, comp.fixed_options)
        result = search.explore(model, workers=workers, backend=backend)
        assert not result.passed
        found.append((result.violations[0].check, result.violations[0].depth))
    assert found[0] == found[1]


# ----------------------------------------------------------------------------- Ray
def test_soak_and_explore_on_a_local_ray_instance(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One Ray instance for both commands (starting Ray takes seconds)."""
    pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)
    ray_module, owned = distributed.connect("local", 2)
    assert owned
    try:
        args = (BM, "--ops", "6000", "--chunk", "1500", "--workers", "2")
        rc, on_ray = soak(capsys, *args, "--backend", "ray")
        rc_local, local = soak(capsys, *args, "--backend", "processes")
        assert rc == rc_local == 0
        assert on_ray["backend"] == "ray" and on_ray["workers"] == 2
        assert on_ray["ops"] == local["ops"] and on_ray["coverage"] == local["coverage"]
        assert main(["explore", LRU, "--variant", "v2", "--workers", "2", "--address", "local",
                     "--json"]) == 0  # fmt: skip
        explored = json.loads(capsys.readouterr().out)
        assert main(["explore", LRU, "--variant", "v2", "--json"]) == 0
        serial = json.loads(capsys.readouterr().out)
        for field in ("distinct_states", "distinct_snapshots", "edges", "states_per_depth"):
            assert explored[field] == serial[field], field
        assert explored["workers"] == 2 and explored["address"] == "local"
        # the block manager's and the scheduler's models cross to the actors (the scheduler's
        # weak mapping once made it unpicklable), the set-table classes are recomputed there
        # (carried over, they held the driver's addresses and classed nothing: 45,807 states
        # instead of 31,781 at the default scope), and states cross as exact copies
        for argv in (
            [BM, "--pages", "3", "--tokens", "2"],
            ["infinilm-scheduler", "--variant", "legacy", "--scope", "base", "--requests", "2"],
        ):
            assert main(["explore", *argv, "--workers", "2", "--address", "local", "--json"]) == 0
            on_ray = json.loads(capsys.readouterr().out)
            assert main(["explore", *argv, "--json"]) == 0
            one = json.loads(capsys.readouterr().out)
            assert on_ray["distinct_states"] == one["distinct_states"], argv
            assert on_ray["states_per_depth"] == one["states_per_depth"], argv
            assert on_ray["transferred_states"] > 0 and on_ray["replayed_paths"] == 0, argv
            assert on_ray["parallel_efficiency"] is not None
    finally:
        ray_module.shutdown()


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_portable_offload_tracker_search_finds_exactly_the_serial_states(policy: str) -> None:
    """With the access tracker on, keys the tracker counts are not fresh and pending keys are not
    interchangeable (their counts differ): a key reduction that treated them as symmetric gave
    path-dependent state counts, so replaying workers found other states than the serial search
    (512 against 516 on LRU v2)."""
    from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
    from proofs.explorer.model_offload import OffloadBounds, OffloadModel

    variant = "v2" if policy == "lru" else "r0.34"
    bounds = OffloadBounds(variant=variant, capacity=2, keys=3, store_threshold=2, tracker=2)
    comp = components.get(f"vllm-{policy}")
    model = OffloadModel(comp.name, ImplManager, "impl", bounds, comp.fixed_options)
    serial = search.explore(model)
    portable = search.explore(model, workers=2, backend=ThreadBackend)
    assert serial.complete and portable.complete and serial.passed and portable.passed
    for field in ("distinct_states", "edges", "states_per_depth"):
        assert getattr(portable, field) == getattr(serial, field), field


def test_portable_scheduler_search_finds_exactly_the_serial_states() -> None:
    """The scheduler's pair key cuts a forgotten request's final row, so one pair is reached with
    several raw snapshots: the portable route is the snapshot as the key holds it (routed by the
    raw snapshot, such a pair went to two workers and was counted twice)."""
    from impl.infinilm.scheduler import Scheduler as ImplScheduler
    from proofs.explorer.model_scheduler import SchedulerBounds, SchedulerModel

    bounds = SchedulerBounds(pages=3, requests=2, prompt_tokens=2, max_new=2)
    model = SchedulerModel("infinilm-scheduler", ImplScheduler, "impl", bounds)
    serial = search.explore(model)
    portable = search.explore(model, workers=3, backend=ThreadBackend)
    assert serial.complete and portable.complete and serial.passed and portable.passed
    for field in ("distinct_states", "edges", "max_depth"):
        assert getattr(portable, field) == getattr(serial, field), field
