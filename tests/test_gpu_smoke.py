"""GPU smoke at tiny size on CPU: real Llama decoding through impl block tables equals the dense oracle.

Also: each planted bug (stale block-table entry, missing last-page tail mask, page freed while still
referenced) makes the smoke fail; the gather path equals a naive dense attention (GQA, chunked
causal prefill, page tails); the Triton decode kernel equals the gather path in Triton's interpreter
(skipped without triton); the attention benchmark runs end to end at toy size; ``kvspec smoke``
prints one JSON document and exits 0 / 1 / 2.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# Triton's interpreter must be chosen before triton is first imported (its standard library is
# decorated then). No CUDA here: interpret every Triton kernel this process runs, on CPU tensors.
if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

from gpu_smoke.attention import gather_attention  # noqa: E402
from gpu_smoke.pool import FreeListWatch, KVPool  # noqa: E402
from impl.infinilm.block_manager import BlockManager  # noqa: E402
from kvspec import smoke  # noqa: E402

DOC_KEYS = {
    "device",
    "model",
    "tokens_generated",
    "tokens_match",
    "max_abs_logit_err",
    "pages_reused",
    "poisoned_pages",
    "attention_bench",
}


def _triton_interpreted() -> bool:
    try:
        import triton.language.standard as standard
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(standard.zeros, InterpretedFunction)


interpreted = pytest.mark.skipif(
    not _triton_interpreted(),
    reason="triton is not installed, or was imported before TRITON_INTERPRET=1 could be set",
)


# ----------------------------------------------------------------------------- the smoke
@pytest.fixture(scope="module")
def tiny_doc() -> dict[str, Any]:
    return smoke.run_smoke("cpu", "tiny", False)


def test_tiny_cpu_smoke_matches_dense_oracle(tiny_doc: dict[str, Any]) -> None:
    doc = tiny_doc
    assert doc.keys() >= DOC_KEYS
    assert doc["passed"], doc["checks"]
    assert doc["device"] == "cpu" and doc["attention_bench"] is None
    assert doc["tokens_match"] is True
    assert doc["tokens_generated"] == sum(r.max_new_tokens for r in _workload().requests)
    assert doc["max_abs_logit_err"] < 1e-4
    work = doc["workload"]
    assert work["requests_finished"] == work["requests"]
    assert doc["pages_reused"] > 0 and doc["poisoned_pages"] > 0
    assert work["evictions"] > 0 and work["reclaiming_calls"] > 0  # pressure forced reclamation
    assert work["prefix_hit_pages"] > 0  # published pages found again through the prefix index
    assert work["page_boundary_crossings"] > 0 and work["decode_only_steps"] > 0
    json.dumps(doc, allow_nan=False)  # stable, strict JSON


def _workload() -> Any:
    """The workload ``run_smoke`` uses at tiny size."""
    from gpu_smoke.model import SIZES
    from gpu_smoke.workload import make_workload

    return make_workload(
        vocab=SIZES["tiny"].vocab, page_size=smoke.PAGE_SIZE["tiny"], num_pages=smoke.NUM_PAGES
    )


def test_cli_knows_every_planted_bug() -> None:
    from gpu_smoke.workload import PLANTS

    assert set(smoke.PLANT_NAMES) == set(PLANTS)


@pytest.mark.parametrize("bug", smoke.PLANT_NAMES)
def test_planted_bug_is_caught_by_the_outputs(bug: str) -> None:
    doc = smoke.run_smoke("cpu", "tiny", False, plant=bug)
    assert not doc["passed"]
    run = doc["runs"][0]
    # caught by what the model computed — wrong or NaN logits — not only by bookkeeping errors
    assert run["first_divergence"] is not None
    assert not run["tokens_match"] or not run["logits_within_tol"]
    first = run["first_divergence"]
    assert run["nonfinite_logits"] > 0 or first["paged_token"] not in (None, first["dense_token"])
    if bug == "missing-tail-mask":
        assert run["nonfinite_logits"] > 0  # the poisoned tail reached the logits
    if bug == "stale-table-entry":
        assert run["error"] is None  # the bookkeeping is fine; only the device table is stale
        assert run["max_abs_logit_err"] is None or run["max_abs_logit_err"] > 0.1


def test_bf16_comparison_against_the_fp32_oracle() -> None:
    """The CUDA run's bf16 check, here through the gather path on CPU."""
    doc = smoke.run_smoke("cpu", "tiny", False, bf16=True)
    bf16 = doc["bf16"]["gather"]
    assert doc["passed"], doc["runs"]
    assert bf16["paged_bf16_err"] <= bf16["allowed_ratio"] * bf16["dense_bf16_err"]
    assert 0 < bf16["clear_margin_matches"] == bf16["clear_margin_tokens"]


def test_cmd_smoke_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    rc = smoke.main(["--device", "cpu", "--size", "tiny", "--json"])
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert rc == 0
    assert doc.keys() >= DOC_KEYS
    assert doc["tokens_match"] and doc["pages_reused"] > 0


def test_cmd_smoke_planted_bug_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc = smoke.main(["--plant", "missing-tail-mask"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cmd_smoke_cuda_without_device_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = smoke.main(["--device", "cuda", "--json"])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvspec: ")


# ----------------------------------------------------------------------------- attention paths
def _naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, ctx: int
) -> torch.Tensor:
    """Dense causal GQA attention in float64: ``q`` ``[n, H, D]`` ends at position ``ctx - 1``."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)  # [ctx, H, D]
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,thd->hnt", q.double(), k) * scale
    pos = torch.arange(ctx - n, ctx)
    scores = scores.masked_fill(torch.arange(ctx)[None, :] > pos[:, None], -math.inf)
    return torch.einsum("hnt,thd->nhd", scores.softmax(-1), v)


def _paged_case(
    seed: int,
    query_lens: list[int],
    context_lens: list[int],
    *,
    heads: int = 8,
    kv_heads: int = 2,
    head_dim: int = 16,
    page_size: int = 4,
    pages: int = 48,
) -> dict[str, Any]:
    """Random K/V for each sequence scattered over pages in random order; unwritten slots are NaN."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.full((pages, page_size, kv_heads, head_dim), math.nan)
    v_cache = torch.full_like(k_cache, math.nan)
    order = torch.randperm(pages, generator=g).tolist()
    max_pages = max(-(-c // page_size) for c in context_lens)
    tables = torch.zeros(len(context_lens), max_pages, dtype=torch.int32)
    dense = []
    for i, ctx in enumerate(context_lens):
        n_pages = -(-ctx // page_size)
        own = [order.pop() for _ in range(n_pages)]
        tables[i, :n_pages] = torch.tensor(own, dtype=torch.int32)
        k = torch.randn(ctx, kv_heads, head_dim, generator=g)
        v = torch.randn(ctx, kv_heads, head_dim, generator=g)
        for t in range(ctx):
            k_cache[own[t // page_size], t % page_size] = k[t]
            v_cache[own[t // page_size], t % page_size] = v[t]
        dense.append((k, v))
    q = torch.randn(sum(query_lens), heads, head_dim, generator=g)
    return {"q": q, "k": k_cache, "v": v_cache, "tables": tables, "dense": dense}


def test_gather_attention_equals_naive_gqa_chunked_prefill_and_tails() -> None:
    query_lens, context_lens = [5, 1, 1, 3, 1], [5, 9, 8, 14, 1]  # prefill, decode, chunk
    case = _paged_case(0, query_lens, context_lens)
    scale = 0.25
    out = gather_attention(
        case["q"], case["k"], case["v"], case["tables"], query_lens, context_lens, scale
    )
    assert torch.isfinite(out).all()
    start = 0
    for n, ctx, (k, v) in zip(query_lens, context_lens, case["dense"], strict=True):
        want = _naive(case["q"][start : start + n], k, v, scale, ctx)
        assert torch.allclose(out[start : start + n].double(), want, atol=1e-5)
        start += n


def test_gather_attention_without_tail_mask_reads_the_poison() -> None:
    query_lens, context_lens = [1, 1], [6, 8]  # 6: the last page is half written; 8: aligned
    case = _paged_case(1, query_lens, context_lens)
    out = gather_attention(
        case["q"], case["k"], case["v"], case["tables"], query_lens, context_lens, 0.25,
        tail_mask=False,
    )  # fmt: skip
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def test_free_list_watch_poisons_evicted_and_recycled_pages() -> None:
    bm = BlockManager(4, 2)
    pool = KVPool(
        layers=1, pages=4, page_size=2, kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu"
    )
    watch = FreeListWatch(bm, pool)
    table, _ = bm.allocate_slots(8)  # every page
    watch.sync(table)
    pool.kv.zero_()  # "written"
    bm.free_blocks(table)  # released: still cached, not poisoned
    watch.sync()
    assert pool.poisoned == 0 and not torch.isnan(pool.kv).any()
    again, _ = bm.allocate_slots(3)  # evicts two cached pages and hands them straight out
    watch.sync(again)
    assert watch.pages_reused == 2 and pool.poisoned >= 2
    for page in again:
        assert torch.isnan(pool.kv[:, :, page]).all()  # poisoned before the new tenant writes


# ----------------------------------------------------------------------------- Triton (interpreter)
@interpreted
@pytest.mark.parametrize(
    ("group", "block_n", "splits", "dtype_name"),
    [
        (4, 16, None, "float32"),
        (4, 16, 2, "float32"),
        (2, 32, 1, "float32"),
        (1, 16, 3, "float32"),
        (4, 32, 2, "float16"),  # the low-precision path (the interpreter cannot do bf16 dots)
    ],
)
def test_triton_decode_equals_gather_in_interpreter(
    group: int, block_n: int, splits: int | None, dtype_name: str
) -> None:
    from gpu_smoke.triton_paged import DecodeConfig, paged_decode

    dtype = getattr(torch, dtype_name)

    context_lens = [1, 7, 16, 29, 40]
    kv_heads = 2
    case = _paged_case(2, [1] * 5, context_lens, heads=group * kv_heads, kv_heads=kv_heads)
    q, k, v = (case[name].to(dtype) for name in ("q", "k", "v"))
    want = gather_attention(
        q.float(), k.float(), v.float(), case["tables"], [1] * 5, context_lens, 0.3
    )
    got = paged_decode(
        q,
        k,
        v,
        case["tables"],
        torch.tensor(context_lens, dtype=torch.int32),
        0.3,
        config=DecodeConfig(block_n=block_n, num_splits=splits),
    )
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert (got.float() - want).abs().max() < (1e-5 if dtype == torch.float32 else 3e-3)


@interpreted
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_triton_decode_without_tail_mask_reads_the_poison() -> None:
    from gpu_smoke.triton_paged import paged_decode

    context_lens = [6, 8]
    case = _paged_case(3, [1, 1], context_lens)
    got = paged_decode(
        case["q"], case["k"], case["v"], case["tables"], torch.tensor(context_lens), 0.3,
        tail_mask=False,
    )  # fmt: skip
    assert torch.isnan(got[0]).all() and torch.isfinite(got[1]).all()


@interpreted
def test_triton_backend_in_the_model_matches_the_oracle() -> None:
    """The tiny smoke with every decode-only step through the Triton kernel (interpreted)."""
    doc = smoke.run_smoke("cpu", "tiny", False, triton=True)
    assert doc["passed"], doc["runs"]
    assert [r["name"] for r in doc["runs"]] == ["fp32 gather", "fp32 triton"]
    assert doc["runs"][1]["max_abs_logit_err"] < 1e-4


@interpreted
def test_attention_bench_runs_at_toy_size() -> None:
    from gpu_smoke.attention_bench import attention_bench
    from gpu_smoke.triton_paged import DecodeConfig

    def timer(fn: Any) -> float:
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e6

    shape = {"batch": 2, "context": 64, "heads": 4, "kv_heads": 2, "head_dim": 16}
    doc = attention_bench(
        shape={**shape, "page_size": 4, "dtype": "float32"},
        device="cpu",
        sweep_configs=[DecodeConfig(block_n=16, num_splits=2)],
        timer=timer,
    )
    assert doc["best_config"]["max_abs_err"] < 1e-4
    for key in ("dense_sdpa_us", "paged_triton_us", "gather_sdpa_us", "paged_over_dense"):
        assert doc[key] > 0
    json.dumps(doc, allow_nan=False)
