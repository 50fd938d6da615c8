"""The oracle: transformers' dense-cache greedy decoding of the same requests, and the comparisons.

fp32: the paged run decodes freely and must produce the oracle's tokens exactly, with logits within
``FP32_ATOL``; logits are compared up to and including the first differing token (after it the two
runs see different inputs). bf16: both bf16 paths are teacher-forced with the fp32 oracle's tokens
and their logits are measured against the fp32 oracle's; the paged error may be at most
``BF16_RATIO`` times the dense bf16 error, and argmax must equal the fp32 token wherever the fp32
top-1/top-2 margin exceeds ``2 * BF16_RATIO * dense error`` (no error within the allowed bound can
flip such a position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gpu_smoke.model import attention, dense_greedy
from gpu_smoke.workload import PagedRun

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

FP32_ATOL = 1e-3
BF16_RATIO = 1.5


@dataclass
class Dense:
    tokens: dict[int, list[int]]
    logits: dict[int, torch.Tensor]


def dense_reference(
    model: LlamaForCausalLM,
    prompts: dict[int, list[int]],
    max_new: dict[int, int],
    forced: dict[int, list[int]] | None = None,
) -> Dense:
    """Greedy-decode every request alone with transformers' eager attention and ``DynamicCache``."""
    tokens, logits = {}, {}
    with attention(model, "eager"):
        for rid in sorted(prompts):
            force = forced[rid] if forced is not None else None
            tokens[rid], logits[rid] = dense_greedy(model, prompts[rid], max_new[rid], force)
    return Dense(tokens, logits)


def _finite_max(x: torch.Tensor) -> tuple[float, int]:
    """(max |x| over finite entries, count of non-finite entries)."""
    bad = int((~torch.isfinite(x)).sum())
    finite = x[torch.isfinite(x)]
    return (float(finite.abs().max()) if finite.numel() else 0.0), bad


def compare_fp32(paged: PagedRun, dense: Dense, *, atol: float = FP32_ATOL) -> dict[str, Any]:
    """Exact tokens, logits within ``atol``; the first divergence, if any, described."""
    max_err, nonfinite = 0.0, 0
    tokens_match = True
    first: dict[str, Any] | None = None
    for rid, want in dense.tokens.items():
        got = paged.tokens.get(rid, [])
        n = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        upto = (n + 1) if n is not None else min(len(got), len(want))
        if got != want:
            tokens_match = False
        err, bad = _finite_max(
            paged.logits[rid][:upto].to(dense.logits[rid]) - dense.logits[rid][:upto]
        )
        max_err, nonfinite = max(max_err, err), nonfinite + bad
        if first is None and (got != want or err > atol or bad):
            row = n if n is not None else min(len(got), len(want))
            margin = None
            if row < len(want):
                top = dense.logits[rid][row].topk(2).values
                margin = float(top[0] - top[1])
            first = {
                "request": rid,
                "token_index": row,
                "paged_token": got[row] if row < len(got) else None,
                "dense_token": want[row] if row < len(want) else None,
                "dense_top1_margin": margin,
                "tokens_generated": len(got),
                "tokens_expected": len(want),
            }
    return {
        "tokens_match": tokens_match,
        "max_abs_logit_err": max_err if nonfinite == 0 else None,
        "nonfinite_logits": nonfinite,
        "logits_within_tol": nonfinite == 0 and max_err <= atol,
        "atol": atol,
        "first_divergence": first,
    }


def compare_bf16(
    reference: Dense, dense_bf16: Dense, paged_bf16: PagedRun, *, ratio: float = BF16_RATIO
) -> dict[str, Any]:
    """bf16 paged vs bf16 dense, both against the fp32 dense oracle (teacher-forced runs)."""
    rids = sorted(reference.logits)
    ref = torch.cat([reference.logits[rid] for rid in rids])
    dense = torch.cat([dense_bf16.logits[rid] for rid in rids])
    complete = all(
        paged_bf16.logits.get(rid, ref[:0]).shape == reference.logits[rid].shape for rid in rids
    )
    paged = torch.cat([paged_bf16.logits[rid] for rid in rids]).to(ref) if complete else None
    dense_diff = (dense - ref).abs()
    dense_err = float(dense_diff.max())
    threshold = 2 * ratio * dense_err  # no error within the bound can flip a wider margin
    top = ref.topk(2, dim=-1).values
    clear_rows = (top[:, 0] - top[:, 1]) > threshold
    result: dict[str, Any] = {
        "dense_bf16_err": dense_err,
        "dense_bf16_mean_err": float(dense_diff.mean()),
        "paged_bf16_err": None,
        "paged_bf16_mean_err": None,
        "err_ratio": None,
        "allowed_ratio": ratio,
        "nonfinite_logits": None,
        "clear_margin": threshold,
        "clear_margin_tokens": int(clear_rows.sum()),
        "clear_margin_matches": 0,
        "tokens_match": False,
        "logits_within_tol": False,
    }
    if paged is None:  # the paged run stopped early: nothing comparable
        return result
    paged_diff = (paged - ref).abs()
    nonfinite = int((~torch.isfinite(paged_diff)).sum())
    want = torch.tensor([t for rid in rids for t in reference.tokens[rid]], device=ref.device)
    agree = int(((paged.argmax(-1) == want) & clear_rows).sum())
    paged_err = float(paged_diff.max()) if nonfinite == 0 else None
    result.update(
        paged_bf16_err=paged_err,
        paged_bf16_mean_err=float(paged_diff.mean()) if nonfinite == 0 else None,
        err_ratio=paged_err / dense_err if paged_err is not None and dense_err > 0 else None,
        nonfinite_logits=nonfinite,
        clear_margin_matches=agree,
        tokens_match=nonfinite == 0 and agree == result["clear_margin_tokens"],
        logits_within_tol=paged_err is not None and paged_err <= ratio * dense_err + 1e-6,
    )
    return result
