"""Triton paged decode attention: split-KV (flash-decoding), GQA-aware, read through block tables.

One query token per sequence. Kernel 1 runs one program per ``(sequence, kv_head, split)``: it loads
the queries of every head in that KV head's group (``heads / kv_heads`` rows, padded to 16 for
``tl.dot``), walks its split of the context ``BLOCK_N`` tokens at a time — token ``t`` lives at slot
``t % PAGE`` of page ``block_table[t // PAGE]`` — and keeps an online softmax (running max, sum,
accumulator in fp32). It writes the split's normalised output and log-sum-exp (base 2). Kernel 2
runs one program per ``(sequence, head)`` and merges the splits by their log-sum-exp; with a
single split, kernel 1 writes the output itself.

Tail mask: tokens ``t >= context_len`` are neither loaded (``mask``/``other=0``) nor scored
(``where(.., -inf)``), so the unwritten, NaN-poisoned end of the last page never reaches the output.
``tail_mask=False`` plants the classic bug (the context rounded up to whole pages).

Kernels are compiled lazily and cached per ``TRITON_INTERPRET`` setting, so the tests can run them
in Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

try:  # the smoke runs without Triton on CPU; only this module needs it
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the machine
    HAVE_TRITON = False

LOG2E = 1.4426950408889634


# The kernels are plain functions until ``_kernels`` jit-compiles them. Their runtime parameters
# are tensors (Triton passes them as pointers) and scalars, typed ``Any``: Triton ships no types,
# and it reads annotations itself (``tl.constexpr`` marks a compile-time constant; a dtype name such
# as ``i32`` would fix the argument's type), which ``Any`` leaves alone.
def _split_kernel(
    Q: Any,
    K: Any,
    V: Any,
    BT: Any,
    CTX: Any,
    MID_O: Any,
    MID_LSE: Any,
    scale_log2: Any,
    split_len: Any,
    stride_qb: Any,
    stride_qh: Any,
    stride_kp: Any,
    stride_kt: Any,
    stride_kh: Any,
    stride_vp: Any,
    stride_vt: Any,
    stride_vh: Any,
    stride_bt: Any,
    stride_ob: Any,
    stride_oh: Any,
    stride_os: Any,
    stride_lb: Any,
    stride_lh: Any,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TAIL_MASK: tl.constexpr,
    IEEE: tl.constexpr,
    DIRECT: tl.constexpr,
) -> None:
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(CTX + b)
    if TAIL_MASK:
        limit = ctx
    else:
        limit = (ctx + PAGE - 1) // PAGE * PAGE
    start = s * split_len
    end = tl.minimum(start + split_len, limit)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + g
    row_ok = g < GROUP
    q_ptr = Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr, mask=row_ok[:, None], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        valid = t < end
        page = tl.load(bt_row + t // PAGE, mask=valid, other=0).to(tl.int64)
        slot = t % PAGE
        k_off = page * stride_kp + slot * stride_kt + kvh * stride_kh
        v_off = page * stride_vp + slot * stride_vt + kvh * stride_vh
        k = tl.load(K + k_off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(V + v_off[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        qk = tl.where(valid[None, :], qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    o_ptr = MID_O + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + d[None, :]
    if DIRECT:  # one split: MID_O is the output itself and there is nothing to merge
        tl.store(o_ptr, out.to(MID_O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptr, out, mask=row_ok[:, None])
        tl.store(MID_LSE + b * stride_lb + heads * stride_lh + s, lse, mask=row_ok)


def _reduce_kernel(
    MID_O: Any,
    MID_LSE: Any,
    OUT: Any,
    num_splits: Any,
    stride_ob: Any,
    stride_oh: Any,
    stride_os: Any,
    stride_lb: Any,
    stride_lh: Any,
    stride_out_b: Any,
    stride_out_h: Any,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
) -> None:
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    s_ok = s < num_splits
    lse = tl.load(MID_LSE + b * stride_lb + h * stride_lh + s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp2(lse - top), 0.0)
    o = tl.load(
        MID_O + b * stride_ob + h * stride_oh + s[:, None] * stride_os + d[None, :],
        mask=s_ok[:, None],
        other=0.0,
    )
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(OUT + b * stride_out_b + h * stride_out_h + d, out.to(OUT.dtype.element_ty))


_KERNELS: dict[bool, tuple[Any, Any]] = {}


def _fix_interpreter_scalars() -> None:
    """Let Triton's interpreter use a runtime scalar as a loop bound under NumPy >= 2.4.

    The interpreter keeps scalars as 1-element arrays and converts them with ``int(array)``, which
    NumPy 2.4 refuses (triton-lang/triton#9171, fixed upstream after 3.6). Wrap its tensor patcher
    so ``__index__`` takes the single element explicitly. Interpreter only; compiled runs never
    come here.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "kvspec_fixed", False):
        return

    def patch(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch.kvspec_fixed = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch


def _kernels() -> tuple[Any, Any]:
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    interpret = bool(triton.knobs.runtime.interpret)
    if interpret:
        _fix_interpreter_scalars()
    if interpret not in _KERNELS:
        _KERNELS[interpret] = (triton.jit(_split_kernel), triton.jit(_reduce_kernel))
    return _KERNELS[interpret]


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters; ``num_splits=None`` picks enough splits to fill the GPU."""

    block_n: int = 64
    num_splits: int | None = None
    num_warps: int = 4
    num_stages: int = 2


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def _multiprocessors() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).multi_processor_count)
    return 132  # an H100/H200, for the interpreter


def default_splits(batch: int, kv_heads: int, max_context: int, block_n: int) -> int:
    """Splits so that about 4 waves of programs cover the GPU, but never splits shorter than a tile."""
    sms = _multiprocessors()
    want = max(1, math.ceil(4 * sms / max(1, batch * kv_heads)))
    return max(1, min(want, math.ceil(max_context / block_n), 64))


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    max_context: int | None = None,
    tail_mask: bool = True,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Decode attention for one new token per sequence.

    ``q``: ``[B, heads, D]``; ``k_cache``/``v_cache``: ``[pages, page_size, kv_heads, D]`` (any
    strides with a contiguous last dimension); ``block_tables``: ``[B, max_pages]`` int32;
    ``context_lens``: ``[B]`` int32, each ``>= 1`` (the new token included, already written).
    Returns ``[B, heads, D]`` in ``q``'s dtype.
    """
    split_kernel, reduce_kernel = _kernels()
    cfg = config or DecodeConfig(block_n=32 if q.dtype == torch.float32 else 64)
    batch, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    if heads % kv_heads or head_dim != _pow2(head_dim) or page_size != _pow2(page_size):
        raise ValueError(f"unsupported shape: heads={heads} kv_heads={kv_heads} D={head_dim}")
    if max_context is None:
        max_context = int(context_lens.max())
    block_n = max(16, cfg.block_n)
    splits = cfg.num_splits or default_splits(batch, kv_heads, max_context, block_n)
    split_len = math.ceil(math.ceil(max_context / splits) / block_n) * block_n
    splits = max(1, math.ceil(max_context / split_len))
    if not tail_mask:  # the planted bug may read up to a page past the context
        splits = max(1, math.ceil(-(-max_context // page_size) * page_size / split_len))
    q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    ctx = context_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    direct = splits == 1
    if direct:  # the split kernel writes the output: [B, H, 1, D] view of ``out``
        mid_o = out.unsqueeze(2)
        mid_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)  # unused
    else:
        mid_o = torch.empty(batch, heads, splits, head_dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)
    split_kernel[(batch, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        tables,
        ctx,
        mid_o,
        mid_lse,
        scale * LOG2E,
        split_len,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        tables.stride(0),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, _pow2(group)),
        HEAD_DIM=head_dim,
        PAGE=page_size,
        BLOCK_N=block_n,
        TAIL_MASK=tail_mask,
        IEEE=q.dtype == torch.float32,
        DIRECT=direct,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if direct:
        return out
    reduce_kernel[(batch, heads)](
        mid_o,
        mid_lse,
        out,
        splits,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        out.stride(0),
        out.stride(1),
        SPLITS_PAD=max(2, _pow2(splits)),
        HEAD_DIM=head_dim,
        num_warps=4,
    )
    return out
