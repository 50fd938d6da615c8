"""Paged attention plugged into transformers' attention-function registry.

``paged_attention_forward`` is registered as ``"kvspec_paged"`` (see ``gpu_smoke.model``). The stock
Llama code calls it once per layer with the new tokens' rotated ``query``/``key``/``value`` and
forwards every extra keyword of the model call to it, so the engine passes one ``paged_batch``
(:class:`PagedBatch`) with the block tables and slot mapping. The batch is flattened: the model sees
``input_ids`` of shape ``[1, T]`` holding every sequence's new tokens back to back, with per-token
``position_ids``; ``query_lens`` says where each sequence's tokens are.

``gather_attention`` is the reference path (CPU and CUDA): per sequence, gather the pages of its
block table, keep the first ``context_len`` tokens (last-page tail mask), and attend causally —
query ``j`` of a chunk of ``n`` new tokens sits at position ``context_len - n + j`` and sees keys
``0..that position``. GQA: query head ``h`` reads KV head ``h // (heads / kv_heads)``. The
arithmetic follows transformers' eager attention (scores and ``P @ V`` in the model dtype, softmax
in fp32), so a bf16 run is compared like for like with the dense bf16 path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_smoke.pool import KVPool


@dataclass
class PagedBatch:
    """Per-step metadata for the paged path: what the engine passes through the model call."""

    pool: KVPool
    slot_mapping: torch.Tensor  # [T] int64: the slot each new token's K/V is written at
    block_tables: torch.Tensor  # [B, max_pages] int32: rows of the engine's device block table
    query_lens: list[int]  # new tokens per sequence, in batch order (sum = T)
    context_lens: list[int]  # tokens in the cache after this step, per sequence
    backend: str = "gather"  # "gather" | "triton" (decode-only steps; others use gather)
    tail_mask: bool = True  # False plants the "missing last-page tail mask" bug
    context_lens_t: torch.Tensor = field(init=False)  # [B] int32 on the pool's device

    def __post_init__(self) -> None:
        self.context_lens_t = torch.tensor(
            self.context_lens, dtype=torch.int32, device=self.block_tables.device
        )

    @property
    def decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens)


def gather_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_lens: list[int],
    context_lens: list[int],
    scale: float,
    *,
    tail_mask: bool = True,
) -> torch.Tensor:
    """Attention of ``q`` (``[T, heads, head_dim]``) over paged K/V; returns ``[T, heads, head_dim]``.

    ``k_cache``/``v_cache``: ``[pages, page_size, kv_heads, head_dim]``. Sequence ``i`` owns the next
    ``query_lens[i]`` rows of ``q`` and ``context_lens[i]`` cached tokens (its new tokens included,
    already written), on pages ``block_tables[i, :ceil(context_len / page_size)]``.
    """
    _, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    start = 0
    for i, (n, ctx) in enumerate(zip(query_lens, context_lens, strict=True)):
        n_pages = -(-ctx // page_size)
        pages = block_tables[i, :n_pages].long()
        k = k_cache[pages].reshape(n_pages * page_size, kv_heads, head_dim)
        v = v_cache[pages].reshape(n_pages * page_size, kv_heads, head_dim)
        kv_len = ctx if tail_mask else n_pages * page_size  # the bug: page-rounded length
        k, v = k[:kv_len].permute(1, 0, 2), v[:kv_len].permute(1, 0, 2)  # [kv_heads, L, D]
        qi = q[start : start + n].view(n, kv_heads, group, head_dim).permute(1, 2, 0, 3)
        scores = torch.matmul(qi, k.unsqueeze(1).transpose(-1, -2)) * scale  # [kvh, g, n, L]
        q_pos = torch.arange(kv_len - n, kv_len, device=q.device)
        k_pos = torch.arange(kv_len, device=q.device)
        causal = k_pos[None, :] <= q_pos[:, None]  # [n, L]
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(probs, v.unsqueeze(1))  # [kvh, g, n, D]
        out[start : start + n] = o.permute(2, 0, 1, 3).reshape(n, heads, head_dim)
        start += n
    return out


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged_batch: PagedBatch | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: write the new K/V at their slots, attend through the pages.

    ``query`` is ``[1, heads, T, head_dim]``, ``key``/``value`` ``[1, kv_heads, T, head_dim]`` (RoPE
    applied); returns ``([1, T, heads, head_dim], None)`` as the stock interfaces do.
    """
    if paged_batch is None:
        raise TypeError("kvspec_paged attention needs paged_batch= in the model call")
    meta = paged_batch
    layer = int(getattr(module, "layer_idx", 0))
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    q = query[0].transpose(0, 1)  # [T, heads, D]
    meta.pool.write(layer, meta.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
    k_cache, v_cache = meta.pool.keys(layer), meta.pool.values(layer)
    if meta.backend == "triton" and meta.decode_only:
        from gpu_smoke.triton_paged import paged_decode

        out = paged_decode(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.context_lens_t,
            scale,
            max_context=max(meta.context_lens),
            tail_mask=meta.tail_mask,
        )
    else:
        out = gather_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_lens,
            meta.context_lens,
            scale,
            tail_mask=meta.tail_mask,
        )
    return out.unsqueeze(0), None
