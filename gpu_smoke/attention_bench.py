"""Attention micro-benchmark (CUDA): the Triton paged decode kernel against dense SDPA, same data.

Fixture (issue 7): batch 64, context 4096, 32 query / 8 KV heads, head dim 128, bf16, page size 16,
every sequence's pages a random permutation of the pool. Three timings of one decode step's
attention, each ``triton.testing.do_bench`` (CUDA events, median), in interleaved rounds (median of rounds):

* ``dense_sdpa_us``: ``scaled_dot_product_attention(enable_gqa=True)`` over contiguous
  ``[B, kv_heads, S, D]`` copies of the very same K/V;
* ``paged_triton_us``: :func:`gpu_smoke.triton_paged.paged_decode` through the block tables — the
  best of a small sweep of launch configurations, every one of them also checked against SDPA;
* ``gather_sdpa_us``: gather the pages into dense tensors, then SDPA (the naive paged path).

Reports ``paged_over_dense`` (goal ≤ 1.15) and ``gather_over_dense``.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from gpu_smoke.triton_paged import DecodeConfig, paged_decode

SHAPE = {
    "batch": 64,
    "context": 4096,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "page_size": 16,
    "dtype": "bfloat16",
}
GOAL = 1.15
ROUNDS = 3
SWEEP = [
    DecodeConfig(block_n=bn, num_splits=s, num_warps=w, num_stages=st)
    for bn, w, st, s in itertools.product((32, 64), (4, 8), (2, 3), (1, 2, 4, 8, 16))
]


def cuda_time_us(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1000.0


def attention_bench(
    *,
    shape: dict[str, Any] | None = None,
    device: str = "cuda",
    sweep_configs: list[DecodeConfig] | None = None,
    timer: Callable[[Callable[[], Any]], float] = cuda_time_us,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Run the benchmark; ``shape``/``device``/``timer`` are overridable so tests can run it small."""
    shape = {**SHAPE, **(shape or {})}
    b, s, h, kvh = shape["batch"], shape["context"], shape["heads"], shape["kv_heads"]
    d, ps = shape["head_dim"], shape["page_size"]
    dtype, dev = getattr(torch, shape["dtype"]), torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    pages = b * s // ps
    pool = torch.randn(2, pages, ps, kvh, d, dtype=dtype, device=dev, generator=gen)
    tables = torch.randperm(pages, device=dev, generator=gen).view(b, s // ps).to(torch.int32)
    ctx = torch.full((b,), s, dtype=torch.int32, device=dev)
    q = torch.randn(b, h, d, dtype=dtype, device=dev, generator=gen)
    scale = d**-0.5
    idx = tables.long()

    def gathered(i: int) -> torch.Tensor:  # [B, kv_heads, S, D] view of the paged K (0) or V (1)
        return pool[i][idx].view(b, s, kvh, d).transpose(1, 2)

    k_dense, v_dense = gathered(0).contiguous(), gathered(1).contiguous()
    q4 = q.unsqueeze(2)

    def dense() -> torch.Tensor:
        return F.scaled_dot_product_attention(q4, k_dense, v_dense, scale=scale, enable_gqa=True)

    def gather_sdpa() -> torch.Tensor:
        k, v = gathered(0), gathered(1)
        return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

    want = dense().squeeze(2).float()
    sweep: list[dict[str, Any]] = []
    best: tuple[float, DecodeConfig] | None = None
    configs = SWEEP if sweep_configs is None else sweep_configs
    for cfg in configs:
        row: dict[str, Any] = {
            "block_n": cfg.block_n,
            "num_splits": cfg.num_splits,
            "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages,
        }

        def paged(cfg: DecodeConfig = cfg) -> torch.Tensor:
            return paged_decode(q, pool[0], pool[1], tables, ctx, scale, max_context=s, config=cfg)

        try:
            err = float((paged().float() - want).abs().max())
            row["max_abs_err"] = err
            row["us"] = timer(paged) if err < 2e-2 else None
        except Exception as exc:  # a configuration the compiler rejects is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        sweep.append(row)
        if row.get("us") is not None and (best is None or row["us"] < best[0]):
            best = (row["us"], cfg)
        log(f"bench {row}")
    rounds: dict[str, list[float]] = {"dense": [], "paged": [], "gather": []}
    winner = best[1] if best is not None else None

    def paged_best() -> torch.Tensor:
        return paged_decode(q, pool[0], pool[1], tables, ctx, scale, max_context=s, config=winner)

    for _ in range(ROUNDS):  # interleaved rounds, median of each: the ratio is side by side
        rounds["dense"].append(timer(dense))
        if winner is not None:
            rounds["paged"].append(timer(paged_best))
        rounds["gather"].append(timer(gather_sdpa))
    dense_us, gather_us = statistics.median(rounds["dense"]), statistics.median(rounds["gather"])
    paged_us = statistics.median(rounds["paged"]) if winner is not None else None
    kv_bytes = 2 * b * s * kvh * d * q.element_size()
    return {
        "shape": shape,
        "dense_sdpa_us": dense_us,
        "gather_sdpa_us": gather_us,
        "paged_triton_us": paged_us,
        "paged_over_dense": None if paged_us is None else paged_us / dense_us,
        "gather_over_dense": gather_us / dense_us,
        "goal_paged_over_dense": GOAL,
        "meets_goal": paged_us is not None and paged_us / dense_us <= GOAL,
        "rounds": ROUNDS,
        "best_config": None if winner is None else sweep[configs.index(winner)],
        "kv_bytes": kv_bytes,
        "dense_tb_per_s": kv_bytes / (dense_us * 1e-6) / 1e12,
        "paged_tb_per_s": None if paged_us is None else kv_bytes / (paged_us * 1e-6) / 1e12,
        "sweep": sweep,
    }
