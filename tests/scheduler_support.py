"""Test doubles and helpers shared by the scheduler's behavioural tests (``test_scheduler*.py``)."""

from __future__ import annotations

import zlib

from spec.infinilm.request import InferenceRequest, RequestStatus, SamplingParams
from spec.infinilm.scheduler import (
    KVConnectorOutput,
    ModelRunnerOutput,
    running_reservation,
)

VOCAB = 64  # sampled token ids are in [0, VOCAB)


# ----------------------------------------------------------------------------- test doubles


class FakeConnector:
    """A PD-disaggregation connector double whose answers are configured per request id.

    ``matches[id] = (external_tokens, is_async)`` (default ``(0, False)``); ``delays[id]`` is the
    ``delay`` answer of ``request_finished`` (default False). Every call is logged.
    """

    def __init__(self, matches=None, delays=None):
        self.matches = dict(matches or {})
        self.delays = dict(delays or {})
        self.log = []

    def get_num_new_matched_tokens(self, req, num_local_computed_tokens):
        self.log.append(("match", req.request_id, num_local_computed_tokens))
        return self.matches.get(req.request_id, (0, False))

    def update_state_after_alloc(self, req, block_table, num_external_tokens, block_size):
        self.log.append(
            ("alloc", req.request_id, tuple(block_table), num_external_tokens, block_size)
        )

    def request_finished(self, req, block_table, block_size):
        self.log.append(("finished", req.request_id, tuple(block_table), block_size))
        return self.delays.get(req.request_id, False), None

    def build_connector_meta(self):
        self.log.append(("meta",))
        return None


# ----------------------------------------------------------------------------- helpers


def mk(request_id, prompt_len, max_tokens, tokens=None, **kwargs):
    """A request with ``prompt_len`` tokens (distinct per id unless ``tokens`` is given)."""
    if tokens is None:
        base = zlib.crc32(request_id.encode()) % 100_000 * 1_000
        tokens = [base + i for i in range(prompt_len)]
    return InferenceRequest(request_id, tokens, SamplingParams(max_tokens=max_tokens), **kwargs)


def ids(reqs):
    return [r.request_id for r in reqs]


def next_token(req):
    """The token the simulated model samples for ``req`` now (deterministic per id and g)."""
    key = f"{req.request_id}:{req.get_num_generated_tokens()}".encode()
    return zlib.crc32(key) % VOCAB


def finish_step(s, out, eos_ids=()):
    """The engine's ``_update_requests`` + ``complete_requests`` for one output (reference §5.1)."""
    for req in out.scheduled_requests:
        s.commit_computed_tokens(req, req.get_total_length())
        token = next_token(req)
        req.append_generated_token_id(token)
        if req.get_num_generated_tokens() >= req.sampling_params.max_tokens or token in eos_ids:
            req.status = RequestStatus.FINISHED
    s.complete_requests(out.scheduled_requests)


def engine_step(s, eos_ids=()):
    """One engine step (reference §5.1): schedule, append one sampled token each, complete.

    A request finishes when g reaches max_tokens or its sampled token is in ``eos_ids``.
    """
    out = s.schedule()
    if out is not None:
        finish_step(s, out, eos_ids)
    return out


def running_scan(s):
    """Σ of the variant's running reservation over the running queue (a scan)."""
    return sum(running_reservation(s.reservation, r, s.block_size) for r in s.running_queue)


def refs(s, pages):
    return [s.cache_manager.blocks[p].ref_count for p in pages]


def events(**kwargs):
    """A model-runner output carrying connector events."""
    return ModelRunnerOutput(KVConnectorOutput(**kwargs))
