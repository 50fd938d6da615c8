"""The model under test: stock transformers ``LlamaForCausalLM`` with seeded random weights.

No downloads: a ``LlamaConfig`` of one of :data:`SIZES`, weights drawn under ``torch.manual_seed``.
``initializer_range`` is ``1 / sqrt(hidden)`` rather than transformers' 0.02, so attention is peaked
and logits spread by about one unit: a wrong or stale K/V row changes the output visibly, and the
greedy top-1 is usually clear of the top-2.

Paged attention enters through transformers' own registry: ``AttentionInterface.register(PAGED,
paged_attention_forward)`` and ``model.set_attn_implementation(PAGED)``; each ``LlamaAttention`` then
looks the function up by ``config._attn_implementation`` and calls it with every extra keyword of
the model call, so the engine passes ``paged_batch=`` there and the Llama code runs unchanged. For
a name not in the mask registry, ``create_causal_mask`` returns ``None``: masking is the paged
function's job. The dense oracle switches the same model to ``"eager"`` and runs transformers'
``DynamicCache``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from transformers import AttentionInterface, DynamicCache, LlamaConfig, LlamaForCausalLM

from gpu_smoke.attention import paged_attention_forward

PAGED = "kvspec_paged"
AttentionInterface.register(PAGED, paged_attention_forward)


@dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SIZES: dict[str, ModelSize] = {
    # CI: seconds on one CPU core
    "tiny": ModelSize(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=128),
    # a few seconds more on CPU, a quick look on CUDA
    "small": ModelSize(layers=4, hidden=256, heads=8, kv_heads=2, intermediate=512, vocab=512),
    # CUDA: the attention shapes of an 8B-class model (32 q / 8 kv heads, head dim 128), 8 layers
    "full": ModelSize(layers=8, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000),
}


def config_for(size: ModelSize) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        head_dim=size.head_dim,
        max_position_embeddings=size.max_positions,
        initializer_range=size.hidden**-0.5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def build_model(
    size: ModelSize, *, seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    """A seeded random-weight Llama on ``device``, in eval mode, with the paged attention selected."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config_for(size))
    # ``PreTrainedModel.to`` (``@functools.wraps``-decorated) casts in place and returns ``self``.
    # typeshed's ``functools._Wrapped`` does not bind ``self`` on instance access, hence the ignore.
    model.to(dtype)  # type: ignore[arg-type]
    model.train(False)  # = model.eval(), which transformers leaves unannotated (mypy: untyped call)
    model.set_attn_implementation(PAGED)
    return model


def describe(name: str, size: ModelSize, params: int) -> dict[str, object]:
    return {
        "name": f"LlamaForCausalLM (random, seeded) {name}",
        "size": name,
        **asdict(size),
        "head_dim": size.head_dim,
        "params": params,
    }


@contextmanager
def attention(model: LlamaForCausalLM, implementation: str) -> Iterator[None]:
    """Run ``model`` with another registered attention implementation, then switch back."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@torch.inference_mode()
def dense_greedy(
    model: LlamaForCausalLM,
    prompt: Sequence[int],
    max_new_tokens: int,
    forced: Sequence[int] | None = None,
) -> tuple[list[int], torch.Tensor]:
    """transformers' own dense-cache greedy decoding: ``(argmax tokens, fp32 logits [n, vocab])``.

    The prompt is prefilled in one call, then one token per call through a ``DynamicCache``, with
    whatever attention implementation ``model`` is set to (the oracle uses ``"eager"``).
    ``forced`` feeds those tokens instead of the argmax (teacher forcing, for the bf16 comparison).
    """
    device = model.device
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    for k in range(max_new_tokens):
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        row = out.logits[0, -1].float()
        rows.append(row)
        tokens.append(int(row.argmax()))
        nxt = forced[k] if forced is not None else tokens[-1]
        ids = torch.tensor([[nxt]], dtype=torch.long, device=device)
    return tokens, torch.stack(rows)
