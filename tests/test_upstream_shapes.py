"""Targets shaped like the real upstream code, driven unchanged: a scheduler without
``reservation=``, with queues that cannot be iterated (as ``janus.Queue``), its own request classes
and a plain ``RuntimeError`` when pages run out; a target whose first snapshot differs (a step-0
counterexample), one kvspec cannot read (exit 2, one line), one whose call never returns (the
watchdog's ``hang``).
"""

from __future__ import annotations

import json
import queue
import sys
import types
from collections import deque
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from kvspec import components
from kvspec.cli import main
from spec.errors import OutOfBlocksError
from spec.infinilm import request as spec_request
from spec.infinilm.scheduler import Scheduler as SpecScheduler
from spec.infinilm.snapshot import queue_items
from stateful_tests.infinilm_scheduler import SPEC_REQUEST_TYPES, request_types

SCHED = "infinilm-scheduler"


class OpaqueQueue:
    """A request queue with janus.Queue's shape: ``sync_q`` works, iteration does not."""

    def __init__(self) -> None:
        self._queue: deque[Any] = deque()
        self.sync_q = self

    def put(self, item: Any) -> None:
        self._queue.append(item)

    def get_nowait(self) -> Any:
        return self._queue.popleft() if self._queue else None

    def qsize(self) -> int:
        return len(self._queue)


class UpstreamShapedScheduler(SpecScheduler):
    """The spec's legacy behaviour behind upstream's constructor (no ``reservation=``), opaque
    queues and upstream's out-of-pages ``RuntimeError``."""

    def __init__(
        self,
        max_batch_size: int = 16,
        num_blocks: int = 512,
        block_size: int = 256,
        max_num_batched_tokens: int = 1024,
        connector: Any = None,
        has_mamba_cache: bool = False,
        num_mamba_cache_blocks: int | None = None,
        enable_prefix_caching: bool = True,
    ) -> None:
        super().__init__(
            max_batch_size=max_batch_size,
            num_blocks=num_blocks,
            block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens,
            connector=connector,
            has_mamba_cache=has_mamba_cache,
            num_mamba_cache_blocks=num_mamba_cache_blocks,
            enable_prefix_caching=enable_prefix_caching,
        )
        self.waiting_queue = OpaqueQueue()  # type: ignore[assignment]
        self.running_queue = OpaqueQueue()  # type: ignore[assignment]

    def schedule(self) -> Any:
        try:
            return super().schedule()
        except OutOfBlocksError as exc:
            raise RuntimeError(str(exc)) from None


def test_queue_items_reads_every_queue_shape_without_taking() -> None:
    opaque = OpaqueQueue()
    opaque.put("a")
    opaque.put("b")
    stdlib: queue.Queue[str] = queue.Queue()
    stdlib.put("a")
    assert queue_items(opaque) == ("a", "b") and opaque.qsize() == 2
    assert queue_items(stdlib) == ("a",) and stdlib.qsize() == 1
    assert queue_items(["x"]) == ("x",)
    with pytest.raises(TypeError, match="cannot read the items of a object request queue"):
        queue_items(object())


def test_request_types_come_from_the_targets_module(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("fake_engine")

    class RequestStatus(Enum):
        WAITING = "w"

    class InferenceRequest(spec_request.InferenceRequest):
        pass

    class Scheduler:
        pass

    Scheduler.__module__ = module.__name__
    module.RequestStatus = RequestStatus  # type: ignore[attr-defined]
    module.InferenceRequest = InferenceRequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    found = request_types(Scheduler)
    assert found.request is InferenceRequest and found.status is RequestStatus
    assert found.sampling is spec_request.SamplingParams  # from the request class's own module
    assert request_types(SpecScheduler) == SPEC_REQUEST_TYPES


def test_an_upstream_shaped_scheduler_is_driven_unchanged() -> None:
    comp = components.get(SCHED)
    for seed in (0, 1):
        result = comp.fuzz(
            UpstreamShapedScheduler, "upstream-shaped", 6_000, seed, variant="legacy"
        )
        assert result.passed, result.failure
        assert "path:decode_out_of_blocks" in result.coverage  # its RuntimeError was recognised


def test_a_target_without_the_variant_keyword_cannot_run_another_variant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    target = f"{__name__}:UpstreamShapedScheduler"
    assert main(["fuzz", SCHED, "--target", target, "--variant", "exact", "--ops", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "constructing the target failed" in err[0] and "reservation" in err[0]
    assert main(["fuzz", SCHED, "--target", target, "--variant", "legacy", "--ops", "300"]) == 0


# ----------------------------------------------------------------------------- toy shapes
def _toy() -> Any:
    from test_toy_component import TOY

    return TOY


from test_toy_component import ImplIdPool  # noqa: E402 (the toy's impl, for the shapes below)


class OffByOneAtStart(ImplIdPool):
    """Its first snapshot already differs from the spec's: one id too many."""

    def __init__(self, size: int) -> None:
        super().__init__(size + 1)


class Unreadable:
    """Has the API, but none of the state kvspec reads."""

    def __init__(self, size: int) -> None:
        pass

    def take(self) -> None:
        return None

    def give(self, i: int) -> None:
        return None

    def snapshot(self) -> Any:
        raise AttributeError("'Unreadable' object has no attribute 'free'")


class Hangs(ImplIdPool):
    """Like the impl, except that handing out the last free id never returns."""

    def take(self) -> Any:
        while len(self.free) == 1:
            pass
        return super().take()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.chdir(tmp_path)
    with components.registered(_toy()) as component:
        yield component


def test_a_first_snapshot_that_differs_is_a_step_0_counterexample(
    toy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"{__name__}:OffByOneAtStart"
    assert main(["fuzz", toy.name, "--target", target, "--ops", "100", "--json"]) == 1
    cx = json.loads(capsys.readouterr().out)["counterexample"]
    assert cx["steps"] == [] and cx["check"] == "snapshot"
    assert main(["check", toy.name, "--target", target]) == 1
    assert "construction" in capsys.readouterr().out


def test_a_target_kvspec_cannot_read_is_exit_2_in_one_line(
    toy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fuzz", toy.name, "--target", f"{__name__}:Unreadable", "--ops", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read the target's state" in err[0] and "'free'" in err[0]


def test_a_call_that_never_returns_is_a_hang(toy: Any, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fuzz", toy.name, "--target", f"{__name__}:Hangs", "--ops", "500", "--json"]
    assert main([*argv, "--call-timeout", "0.2", "--no-shrink"]) == 1
    cx = json.loads(capsys.readouterr().out)["counterexample"]
    assert cx["check"] == "hang" and cx["steps"][-1]["method"] == "take"
    assert "TimeoutError" in cx["steps"][-1]["target"]


def test_a_target_without_the_variant_keyword_is_checked_in_the_default_variant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    target = f"{__name__}:UpstreamShapedScheduler"
    argv = ["fuzz", SCHED, "--target", target, "--ops", "400", "--json"]
    assert main([*argv, "--request-module", "spec.infinilm.request"]) == 0
    assert json.loads(capsys.readouterr().out)["variant"] == "legacy"  # not drawn
    assert main(["fuzz", "vllm-arc", "--request-module", "x", "--ops", "5"]) == 2
    assert "--request-module applies to infinilm-scheduler" in capsys.readouterr().err
