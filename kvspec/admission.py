"""``kvspec admission``: how many requests of the next wave each reservation variant admits.

A manifest describes a pool and a few waves of requests by size only::

    {"block_size": 16, "num_blocks": 64, "enable_prefix_caching": false,
     "max_batch_size": 8,              # optional; unbounded (10**9) when absent
     "max_num_batched_tokens": 4096,   # optional; unbounded (10**9) when absent
     "waves": [[{"prompt_len": 17, "max_tokens": 16}, ...], [...], ...],
     "comment": "free text"}           # optional

For each variant (``legacy``, ``exact``, ``tight``; spec/infinilm/scheduler.py) a fresh *spec*
``Scheduler`` replays the engine loop of docs/infinilm.md §5.1, one engine step being
``schedule()``, then for every scheduled request ``commit_computed_tokens(req, P + g)`` and one
appended token (a request whose ``g`` reaches ``max_tokens`` finishes, LENGTH), then
``complete_requests(batch)``:

1. Wave 1 is added and prefill steps run until every wave-1 request has been admitted and has its
   first token. A step that admits nothing (the waiting head is rejected, so ``schedule()`` would
   fall through to a decode step) is *undone* and filling stops: running requests never decode
   here, so a running request always holds exactly one generated token.
2. Wave k >= 2 is added behind whatever is still waiting, and the running queue's decode
   reservation (``num_reserved_decode_blocks``) and ``get_total_usable_blocks()`` are read; then
   one ``schedule()`` runs and ``admitted`` counts the wave-k requests in its batch. Before wave
   k + 1 the filling of step 1 continues for wave k (that first step included).

Request ``i`` (0-based over the whole manifest) has the prompt ``[i + 1] * prompt_len``, so no two
requests share a prefix block whether or not prefix caching is on.

Result per variant: ``wave1_requests``, ``wave1_running`` and ``wave1_finished`` (wave-1 requests
in the running queue, or already finished because ``max_tokens`` is 1, when wave 2 arrives), the
wave-2 figures ``running_reserved_blocks``, ``usable_blocks`` and ``admitted`` at the top level, and
``waves``: one record per wave k >= 2 (``wave``, ``requests``, ``waiting_ahead``,
``running_requests``, ``previous_wave_running``, ``previous_wave_finished``,
``running_reserved_blocks``, ``usable_blocks``, ``admitted``); the first record repeats the
top-level wave-2 figures.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec.infinilm.request import InferenceRequest, RequestStatus, SamplingParams
from spec.infinilm.scheduler import RESERVATIONS, Scheduler, SchedulerOutput

UNBOUNDED = 10**9  # batch size / token budget when the manifest does not set them
REQUIRED = ("block_size", "num_blocks", "enable_prefix_caching", "waves")
OPTIONAL = ("max_batch_size", "max_num_batched_tokens", "comment")
REQUEST_KEYS = ("prompt_len", "max_tokens")
# Upper bounds that keep one prediction within seconds (and token ids within int32).
MAX_NUM_BLOCKS = 1 << 20
MAX_BLOCK_SIZE = 1 << 16
MAX_PROMPT_LEN = 1 << 20
MAX_MAX_TOKENS = 1 << 24
MAX_REQUESTS = 4096


class ManifestError(ValueError):
    """The manifest cannot be read or is malformed (the message is one line)."""


@dataclass(frozen=True)
class RequestSpec:
    prompt_len: int
    max_tokens: int


@dataclass(frozen=True)
class Manifest:
    block_size: int
    num_blocks: int
    enable_prefix_caching: bool
    max_batch_size: int | None
    max_num_batched_tokens: int | None
    waves: tuple[tuple[RequestSpec, ...], ...]


# ----------------------------------------------------------------------------- manifest
def _int(value: Any, where: str, low: int, high: int) -> int:
    if type(value) is not int:  # bool is an int subclass: rejected too
        raise ManifestError(f"{where} must be an int, got {json.dumps(value)}")
    if not low <= value <= high:
        raise ManifestError(f"{where} must be between {low} and {high}, got {value}")
    return value


def parse_manifest(data: Any) -> Manifest:
    """Validate a decoded manifest. Raises :class:`ManifestError` naming the offending value."""
    if not isinstance(data, dict):
        raise ManifestError(f"the manifest must be a JSON object, got {type(data).__name__}")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise ManifestError(f"missing key(s): {', '.join(missing)}")
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ManifestError(
            f"unknown key(s): {', '.join(unknown)} (allowed: {', '.join(REQUIRED + OPTIONAL)})"
        )
    if not isinstance(data.get("comment", ""), str):
        raise ManifestError(f"comment must be a string, got {json.dumps(data['comment'])}")
    block_size = _int(data["block_size"], "block_size", 1, MAX_BLOCK_SIZE)
    num_blocks = _int(data["num_blocks"], "num_blocks", 1, MAX_NUM_BLOCKS)
    caching = data["enable_prefix_caching"]
    if not isinstance(caching, bool):
        raise ManifestError(
            f"enable_prefix_caching must be true or false, got {json.dumps(caching)}"
        )
    limits: dict[str, int | None] = {}
    for key in ("max_batch_size", "max_num_batched_tokens"):
        value = data.get(key)
        limits[key] = None if value is None else _int(value, key, 1, UNBOUNDED)
    waves_in = data["waves"]
    if not isinstance(waves_in, list) or len(waves_in) < 2:
        raise ManifestError(
            "waves must be a list of at least two waves (lists of requests), got "
            + (f"{len(waves_in)} wave(s)" if isinstance(waves_in, list) else json.dumps(waves_in))
        )
    waves: list[tuple[RequestSpec, ...]] = []
    count = 0
    for w, wave in enumerate(waves_in):
        if not isinstance(wave, list) or not wave:
            raise ManifestError(
                f"waves[{w}] must be a non-empty list of requests, got {json.dumps(wave)}"
            )
        requests = []
        for r, item in enumerate(wave):
            where = f"waves[{w}][{r}]"
            if not isinstance(item, dict):
                raise ManifestError(f"{where} must be an object with prompt_len and max_tokens")
            absent = [key for key in REQUEST_KEYS if key not in item]
            if absent:
                raise ManifestError(f"{where} is missing {', '.join(absent)}")
            extra = sorted(set(item) - set(REQUEST_KEYS))
            if extra:
                raise ManifestError(f"{where} has unknown key(s): {', '.join(extra)}")
            requests.append(
                RequestSpec(
                    _int(item["prompt_len"], f"{where}.prompt_len", 1, MAX_PROMPT_LEN),
                    _int(item["max_tokens"], f"{where}.max_tokens", 1, MAX_MAX_TOKENS),
                )
            )
        count += len(requests)
        if count > MAX_REQUESTS:
            raise ManifestError(f"more than {MAX_REQUESTS} requests in all")
        waves.append(tuple(requests))
    return Manifest(
        block_size,
        num_blocks,
        caching,
        limits["max_batch_size"],
        limits["max_num_batched_tokens"],
        tuple(waves),
    )


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate ``path``; every problem is a one-line :class:`ManifestError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ManifestError(f"cannot read manifest {path}: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(
            f"manifest {path} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    try:
        return parse_manifest(data)
    except ManifestError as exc:
        raise ManifestError(f"manifest {path}: {exc}") from None


# ----------------------------------------------------------------------------- simulation
State = tuple[Scheduler, list[list[InferenceRequest]]]


def _engine_step(sched: Scheduler, out: SchedulerOutput) -> None:
    """Reference §5.1 without a model: KV for P + g tokens exists, then one token is sampled."""
    for req in out.scheduled_requests:
        sched.commit_computed_tokens(req, req.get_total_length())
        req.append_generated_token_id(0)
        if req.get_num_generated_tokens() >= req.sampling_params.max_tokens:
            req.status = RequestStatus.FINISHED  # LENGTH
    sched.complete_requests(out.scheduled_requests)


def _step(state: State, wave: int) -> tuple[State, int | None]:
    """One prefill step on a copy of ``state``.

    Returns the new state and how many wave-``wave`` requests it admitted; when the step admits
    nothing (no batch, or a decode batch), returns the *unchanged* ``state`` and ``None``.
    """
    trial: State = copy.deepcopy(state)  # requests and scheduler copied together
    sched, requests = trial
    out = sched.schedule()
    if out is None or not out.is_prefill:
        return state, None
    ours = {id(r) for r in requests[wave]}
    admitted = sum(1 for r in out.scheduled_requests if id(r) in ours)
    _engine_step(sched, out)
    return trial, admitted


def _fill(state: State, wave: int) -> State:
    """Prefill steps until every wave-``wave`` request has its first token, or nothing is admitted."""
    while any(r.get_num_generated_tokens() == 0 for r in state[1][wave]):
        state, admitted = _step(state, wave)
        if admitted is None:
            break
    return state


def _counts(requests: list[InferenceRequest]) -> tuple[int, int]:
    running = sum(
        1
        for r in requests
        if r.status is RequestStatus.RUNNING and r.get_num_generated_tokens() >= 1
    )
    finished = sum(1 for r in requests if r.is_finished())
    return running, finished


def simulate(manifest: Manifest, variant: str) -> dict[str, Any]:
    """The prediction for one reservation variant (see the module docstring for the keys)."""
    sched = Scheduler(
        max_batch_size=manifest.max_batch_size or UNBOUNDED,
        num_blocks=manifest.num_blocks,
        block_size=manifest.block_size,
        max_num_batched_tokens=manifest.max_num_batched_tokens or UNBOUNDED,
        enable_prefix_caching=manifest.enable_prefix_caching,
        reservation=variant,
    )
    requests: list[list[InferenceRequest]] = []
    n = 0
    for wave in manifest.waves:
        requests.append([])
        for spec in wave:
            n += 1
            requests[-1].append(
                InferenceRequest(
                    f"w{len(requests)}r{len(requests[-1])}",
                    [n] * spec.prompt_len,
                    SamplingParams(spec.max_tokens),
                )
            )
    state: State = (sched, requests)
    records: list[dict[str, Any]] = []
    wave1: tuple[int, int] = (0, 0)
    for k in range(len(manifest.waves)):
        sched, requests = state
        waiting_ahead = sched.waiting_queue.qsize()
        for req in requests[k]:
            sched.add_request(req)
        if k == 0:
            state = _fill(state, 0)
            wave1 = _counts(state[1][0])
            continue
        running, finished = _counts(requests[k - 1])
        record = {
            "wave": k + 1,
            "requests": len(requests[k]),
            "waiting_ahead": waiting_ahead,
            "running_requests": sched.running_queue.qsize(),
            "previous_wave_running": running,
            "previous_wave_finished": finished,
            "running_reserved_blocks": sched.num_reserved_decode_blocks,
            "usable_blocks": sched.cache_manager.get_total_usable_blocks(),
        }
        state, admitted = _step(state, k)
        record["admitted"] = admitted or 0
        records.append(record)
        if admitted is not None and k + 1 < len(manifest.waves):
            state = _fill(state, k)
    first = records[0]
    return {
        "wave1_requests": len(manifest.waves[0]),
        "wave1_running": wave1[0],
        "wave1_finished": wave1[1],
        "running_reserved_blocks": first["running_reserved_blocks"],
        "usable_blocks": first["usable_blocks"],
        "admitted": first["admitted"],
        "waves": records,
    }


def predict(manifest: Manifest) -> dict[str, dict[str, Any]]:
    """``{variant: simulate(manifest, variant)}`` for legacy, exact and tight."""
    return {variant: simulate(manifest, variant) for variant in RESERVATIONS}


# ----------------------------------------------------------------------------- verify stages
# Package data (pyproject: tool.setuptools.package-data), so a regular install finds it too.
EXAMPLE_MANIFEST = Path(__file__).resolve().parent / "data" / "admission_manifest.json"


def _kept_counterexamples() -> Path:
    import stateful_tests

    return Path(stateful_tests.__file__).resolve().parent / "counterexamples"


def soundness_stage(component: Any, quick: bool) -> tuple[str, str]:
    """``kvspec verify``: the spec admits soundly without a PD connector (a fuzzed search per
    variant with ``soundness``), and each variant's kept PD counterexample still fails."""
    from spec.infinilm.scheduler import Scheduler as Spec
    from stateful_tests.lockstep import load_trace

    events = 5_000 if quick else 30_000
    folder = _kept_counterexamples()
    parts = []
    for variant in component.variants:
        r = component.fuzz(
            Spec,
            "spec",
            events,
            0,
            variant=variant,
            soundness=True,
            speculation=False,
            connector=False,
        )
        if not r.passed:
            detail = r.failure.detail if r.failure else ""
            return "fail", f"{variant} unsound without a connector: {detail}"
        trace = load_trace(folder / f"admission_soundness_{variant}.json")
        if component.replay(trace, Spec, "spec", soundness=True).passed:
            return "fail", f"{variant}: the kept PD counterexample no longer fails"
        parts.append(f"{variant}: sound in {events:,} events, {len(trace['steps'])}-event PD cx")
    return "pass", "; ".join(parts)


def predictor_stage(component: Any, quick: bool) -> tuple[str, str]:
    """``kvspec verify``: the admission predictor on the example manifest."""
    result = predict(load_manifest(EXAMPLE_MANIFEST))
    admitted = ", ".join(f"{v} {d['admitted']}" for v, d in result.items())
    return "pass", f"example manifest, wave-2 admitted: {admitted}"
