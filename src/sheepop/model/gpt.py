"""The GPT of docs/architecture.md in PyTorch: a decoder-only, pre-norm transformer.

    h0 = Drop(E[x] + positions)        the positions unit (positions.py) adds what the
                                       config adds (P[pos], ...) and gives the positions
                                       attention turns queries and keys by (RoPE)
    h  = h + Drop(Attn(Norm1(h)))      for each block (attention.py, norm.py)
    h  = h + Drop(FFN(Norm2(h)))       (ffn.py); the blocks run through `Skips` (skips.py:
                                       U-net skips), some attentions mix value embeddings
                                       into their values (value_embeds.py)
    logits = Norm_f(h) W_head^T (+ b_head)       W_head = E when tied
    logits = c tanh(logits / c)                  with model.logit_softcap = c (softcap.py)

Each layer kind is one unit chosen by the config; parameter names match the NumPy engine
(sheepop.scratch) and the checkpoint format exactly. Initialisation follows the shared rule
`sheepop.arch.params.init_rule`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.arch import IGNORE_INDEX
from sheepop.arch.batch import allowed_keys
from sheepop.arch.hooks import Hooks, LayerHooks
from sheepop.arch.kv_cache import KVCache, slides
from sheepop.arch.packed import Packed
from sheepop.arch.params import check_shapes, init_rule
from sheepop.config.schema import ModelConfig
from sheepop.model.attention import CausalSelfAttention
from sheepop.model.ffn import make_ffn
from sheepop.model.norm import make_norm
from sheepop.model.positions import Pos, Positions, add_positions, position_modules
from sheepop.model.skips import Skips
from sheepop.model.softcap import softcap
from sheepop.model.value_embeds import ValueEmbeddings, ValueMix

DecodeBlock = Callable[..., torch.Tensor]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
                  ) -> torch.Tensor:
    """L = -(1/N) sum_{t: y_t != -1} log softmax(z_t)[y_t], N = number of counted targets
    (docs/derivations/head-and-loss.md, with the tied head).

    Half-precision logits (bf16/fp16 autocast) are promoted to float32 for an accurate loss;
    float32 and float64 logits are used as they are.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction=reduction)


class Block(nn.Module):
    """Pre-norm block: x1 = x + Drop(Attn(LN1(x))); x2 = x1 + Drop(FFN(LN2(x1)))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = make_norm(cfg)
        self.ffn = make_ffn(cfg)
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.hooks: LayerHooks | None = None  # set for one pass by sheepop.model.hooks

    def forward(self, x: torch.Tensor, positions: Positions, pos: Pos,
                cache: KVCache | None = None, layer: int = 0,
                attn_mask: torch.Tensor | None = None, values: ValueMix | None = None
                ) -> torch.Tensor:
        hooks = self.hooks
        if hooks is None:
            x = x + self.resid_drop(self.attn(self.ln1(x), positions, pos, cache, layer,
                                              attn_mask, values))
            return x + self.resid_drop(self.ffn(self.ln2(x)))
        x = hooks.at("resid_in", x)
        a = self.attn(hooks.at("ln1", self.ln1(x)), positions, pos, cache, layer, attn_mask,
                      values)
        x = hooks.at("resid_mid", x + self.resid_drop(hooks.at("attn.out", a)))
        f = hooks.at("ffn.out", self.ffn(hooks.at("ln2", self.ln2(x))))
        return hooks.at("resid_out", x + self.resid_drop(f))


class TokenEmbedding(nn.Embedding):
    """E (V, d): x -> E[x] (docs/derivations/embedding.md). `table()` is the matrix the lookup
    (and a tied head) reads; LoRA's trained new-token rows replace its last rows there
    (sheepop.model.lora)."""

    def table(self) -> torch.Tensor:
        return self.weight


class Head(nn.Module):
    """Output head: logits = x W^T + b, W its own (untied) or the token embedding (tied)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = None if cfg.tie_weights else nn.Parameter(
            torch.empty(cfg.vocab_size, cfg.n_embd))
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.head_bias else None

    def forward(self, x: torch.Tensor, tied_weight: torch.Tensor) -> torch.Tensor:
        w = tied_weight if self.weight is None else self.weight
        return F.linear(x, w, self.bias)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer)")
        self.cfg = cfg
        self.tok_emb = TokenEmbedding(cfg.vocab_size, cfg.n_embd)
        for name, module in position_modules(cfg).items():  # pos_emb, and what it needs
            self.add_module(name, module)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.skips = Skips(cfg)
        self.value_embeds = ValueEmbeddings(cfg) if cfg.value_embeds else None
        self.ln_f = make_norm(cfg)
        self.head = Head(cfg)
        self.hooks: Hooks | None = None  # set for one pass by sheepop.model.hooks
        # How a one-token step with a cache runs each block: None, the block itself; else
        # decode_block(block, x, positions, pos, its layer's cache, attn_mask, values), the
        # function sheepop.model.lm.TorchLM.compile compiles once for every layer
        self.decode_block: DecodeBlock | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every parameter by the shared rule (sheepop.arch.params): gains 1, biases 0,
        weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer))."""
        for name, p in self.named_parameters():
            kind, std = init_rule(name, self.cfg.n_layer, self.cfg.zero_init_proj)
            if kind == "ones":
                nn.init.ones_(p)
            elif kind == "zeros":
                nn.init.zeros_(p)
            elif kind == "fill":
                nn.init.constant_(p, std)
            else:
                nn.init.normal_(p, 0.0, std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None, last_only: bool = False,
                pos_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None):
        """Logits (B, T, V) and the mean loss when targets are given.

        With a cache, `idx` continues the cached positions. `last_only` computes the head for the
        last position only (generation). The hooks of sheepop.model.hooks read or replace its
        named points (embed, each block's, final_norm, logits; docs/hooks.md).

        Batches of prompts of different lengths (left padding): `pos_ids` (B, T) gives each
        token's position within its own row, and `attn_mask` (B, 1, T, cached + T) the keys
        each query may see (`sheepop.arch.batch.allowed_keys`).

        Rotary positions exist at any index, so with rope a sequence may pass block_size: each
        query then attends over the block_size most recent keys (sliding-window attention),
        which is also what a rolling cache computes (sheepop.arch.kv_cache).

        A `Packed` cache (sheepop.arch.packed) holds several sequences' new tokens end to end in
        one row, `idx` (1, N) with `pos_ids` its tokens' positions: every unit but attention runs
        over them at once, attention per sequence against its own cache (CausalSelfAttention),
        and `last_only` keeps each sequence's last token (a running batch's decode step and a
        joining prompt's chunk in one pass).
        """
        B, T = idx.shape
        packed = isinstance(cache, Packed)  # several sequences' tokens in one row (pos_ids given)
        start = cache.length if cache is not None and not packed else 0
        if start + T > self.cfg.block_size and not slides(self.cfg):
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size "
                             f"{self.cfg.block_size}")
        if attn_mask is None and cache is None and T > self.cfg.block_size:
            window = allowed_keys(T, 0, window=self.cfg.block_size)
            attn_mask = torch.from_numpy(window).to(idx.device)
        pos = slice(start, start + T) if pos_ids is None else pos_ids
        table = self.tok_emb.table()
        x, pos = add_positions(self, F.embedding(idx, table), idx, pos, cache)
        x = self.drop(x)
        hooks = self.hooks
        if hooks is not None:
            x = hooks.at("embed", x)
        values = (self.value_embeds.per_layer(idx) if self.value_embeds is not None
                  else [None] * len(self.blocks))

        # (from 2 cached tokens: torch.compile makes a graph of its own for an int of 0 or 1)
        compiled = (self.decode_block is not None and T == 1 and cache is not None
                    and not packed and cache.length >= 2)

        def block(i: int, x: torch.Tensor) -> torch.Tensor:
            unit = self.blocks[i]
            if compiled and unit.hooks is None:  # a hooked pass runs eagerly
                return self.decode_block(unit, x, self.pos_emb, pos, cache.layer(i),
                                         attn_mask, values[i])
            return unit(x, self.pos_emb, pos, cache, i, attn_mask, values[i])

        x = self.skips(x, block)
        if cache is not None:
            cache.advance(T)
        x = self.ln_f(x)
        if last_only:  # (packed: each row's last token, sheepop.arch.packed)
            x = x[:, torch.as_tensor(cache.last, device=x.device)] if packed else x[:, -1:, :]
        if hooks is not None:
            x = hooks.at("final_norm", x)
        logits = softcap(self.head(x, table), self.cfg.logit_softcap)
        if hooks is not None:
            logits = hooks.at("logits", logits)
        loss = cross_entropy(logits, targets) if targets is not None else None
        return logits, loss

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        """A KV cache of up to `max_len` (default block_size) positions in the model's device
        and dtype, growing with the tokens (sheepop.arch.kv_cache)."""
        return KVCache.growing(self.cfg, batch, self.cache_buffer, max_len)

    def cache_buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The cache's allocation hook: an uninitialised buffer in the model's device and dtype
        (the cache zeroes what it must). Made outside inference mode even when a forward pass
        grows the cache, so that code outside it may still write into the buffers
        (sheepop.generation.running_batch does)."""
        p = self.tok_emb.weight
        with torch.inference_mode(False):
            return torch.empty(shape, device=p.device, dtype=p.dtype)

    def set_attention_path(self, sdpa: bool) -> None:
        for block in self.blocks:
            block.attn.use_sdpa = sdpa

    # The checkpoint format is NumPy float32, keyed by the shared parameter names.
    def numpy_weights(self) -> dict[str, np.ndarray]:
        """Every parameter as float32; a layer whose weight is stored quantized
        (sheepop.model.quantized: it has `dequantized()`) gives that weight dequantized, under
        the name of the one it replaced; a tied head's quantized copy of the embedding none."""
        weights = {name: p.detach().float().cpu().numpy() for name, p in self.named_parameters()}
        for name, module in self.named_modules():
            if hasattr(module, "dequantized") and not getattr(module, "tied", False):
                weights[f"{name}.weight"] = module.dequantized().cpu().numpy()
        return weights

    def load_numpy_weights(self, weights: dict[str, np.ndarray], where: str = "checkpoint"
                           ) -> None:
        params = dict(self.named_parameters())
        check_shapes({name: np.shape(w) for name, w in weights.items()},
                     {name: p.shape for name, p in params.items()}, where)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(torch.from_numpy(np.asarray(weights[name], dtype=np.float32)))
