"""The torch engine's side of the generation loops: `TorchLM`, the arithmetic of a `CachedLM`.

The bookkeeping of caches and left-padded batches is shared (sheepop.generation.cached_lm); this
class runs the forward pass under `torch.inference_mode`, with an optional `torch.compile`, a
chosen dtype, and the weight layout that makes a single-token step fastest on the CPU.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from sheepop.arch.batch import allowed_keys
from sheepop.arch.kv_cache import KVCache, slides
from sheepop.arch.layout import column_major
from sheepop.arch.packed import Packed, packs
from sheepop.generation.cached_lm import CachedLM
from sheepop.generation.steering import point_of
from sheepop.model import compiler
from sheepop.model.gpt import GPT, Block
from sheepop.model.hooks import hooked
from sheepop.model.positions import Pos, Positions
from sheepop.model.quantized import Int8Head
from sheepop.model.value_embeds import ValueMix


class TorchLM(CachedLM):
    """Next-token logits from a `GPT`, with its preallocated KV cache, under inference_mode.

    `compile=True` runs a one-token step's blocks through one `torch.compile`d function
    (`compile`), compiled at once.

    On CPU in float32 each weight matrix W (out, in), the token table (the tied head) included,
    is re-stored in the order the BLAS library's one-token product reads fastest
    (`decode_layout`, the rule of sheepop.arch.layout: column-major where out >= in): same
    shapes and values, so the model and its checkpoint are unchanged (bfloat16 runs fastest
    row-major, so `cast` puts them back; docs/inference.md).
    """

    def __init__(self, model: GPT, compile: bool = False, decode_layout: bool = True,
                 never_generate: Sequence[int] = ()):
        super().__init__(model.cfg.block_size, never_generate, slides(model.cfg))
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.decode_layout = decode_layout and self.device.type == "cpu"
        _set_layout(model, self._layout_pays())
        self.forward = model
        self.compiled = False  # TorchLM.compile
        self._new_caches()
        if compile:
            self.compile()

    def _layout_pays(self) -> bool:
        # Measured: float32 products read column-major weights faster, bfloat16 ones row-major.
        return self.decode_layout and self.model.tok_emb.weight.dtype == torch.float32

    def cast(self, dtype: torch.dtype) -> None:
        """Run in `dtype` from now on (weights and KV cache; logits still come out as float32).

        bfloat16 halves the bytes every decode step reads, and a decode step is bound by
        reading the weights: on CPUs with bf16 instructions it is the cheap speed-up."""
        self.model.to(dtype)
        _set_layout(self.model, self._layout_pays())
        self._new_caches()
        if self.compiled:  # (its guards do not check the modules' weights)
            self.compile()

    def compile(self, backend: str | Callable = "inductor") -> float:
        """Run each block of a one-token step through one `torch.compile`d function from now on
        (`GPT.decode_block`); compile it now, on a scratch cache, and return the seconds it
        took (inductor keeps the result on disk: the next start of the same model shape and
        dtype reads it). Prompts run eagerly (one pass a generation).

        Every layer runs the same graph (its own layer's cache, KVCache.layer), so compiling
        costs one block's, not n_layer's (the whole model compiled took 267-559 s for
        SmolLM2's 30 layers). Dynamic shapes, so a growing cache does not compile again, and
        without duck shaping: torch.compile otherwise takes two sizes that are equal when it
        traces (a capacity of 64 columns, 64 values a head) for one symbol and compiles again
        once they part. Dynamo's guards on the modules' attributes (~240 checks a call, ~0.26
        ms, 30 calls a token) are skipped (`skip_guard_on_all_nn_modules_unsafe`; those on
        shapes and sizes stay): the function is this model's own (a code object of its own:
        dynamo's cache is per code object), its modules do not change once built (`cast`
        compiles again), and a hooked pass runs eagerly. `realize_opcount_threshold` 1:
        inductor otherwise folds a cheap producer (a norm, the rounding of the activations)
        into the loop of each consumer, recomputing it once per weight row
        (docs/performance.md, "Compiled decoding"). An int8 head (int8, int4) is compiled
        too, for its product to run the loop that reads int8 words (Int8Linear._words_product)
        where that loop pays (an AVX2 CPU: SmolLM2's took 6.0 ms a token against the kernel's
        10.2); elsewhere its compiled product is the kernel, as eagerly
        (quantized.WORDS_LOOP_PAYS)."""
        options = ({"realize_opcount_threshold": 1,
                    "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
                   if backend == "inductor" else None)
        from torch.fx.experimental import _config as symbolic_shapes
        symbolic_shapes.use_duck_shape = False
        own = types.FunctionType(one_block.__code__.replace(), one_block.__globals__)
        self.model.decode_block = compiler.compile(own, dynamic=True, backend=backend,
                                                   options=options)
        if isinstance(self.model.head, Int8Head):  # (dynamo's own guards: one call a token)
            self.model.head.compile(dynamic=True, backend=backend,
                                    options=options and {"realize_opcount_threshold": 1})
        self.compiled = True
        return self._warm_up()

    def _warm_up(self) -> float:
        """Seconds of a scratch decode step at 2 cached tokens (the compilation, when inductor's
        cache does not hold it yet); none in a context of under 4 tokens."""
        started = time.perf_counter()
        if self.block_size >= 4:
            cache = self._new_cache(1)
            self._logits(np.zeros((1, 2), np.int64), cache)
            self._logits(np.zeros((1, 1), np.int64), cache)
        return time.perf_counter() - started

    def _new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        return self.model.new_cache(batch, max_len)

    def _logits(self, idx: np.ndarray, cache: KVCache | None, pos_ids: np.ndarray | None = None,
                key_mask: np.ndarray | None = None, last_only: bool = True) -> np.ndarray:
        if cache is not None:  # grow here, not in the forward pass: torch.compile cannot
            # trace an allocation of a symbolic size. Compiled, one column more than the step
            # needs: a step whose keys filled the buffer exactly would be compiled again (the
            # full slice is a case of its own to torch.compile), at every growth of the cache.
            cache.make_room(idx.shape[1] + self.compiled)
        kw = {}
        if pos_ids is not None:
            past = cache.query_offset(idx.shape[1]) if cache is not None else 0
            kw = {"pos_ids": self._tensor(pos_ids),
                  "attn_mask": self._tensor(allowed_keys(idx.shape[1], past, key_mask,
                                                         self.block_size))}
        with torch.inference_mode(), generation_attention(self.device), self._steered():
            logits, _ = self.forward(self._tensor(idx), cache=cache, last_only=last_only, **kw)
        return (logits[:, -1] if last_only else logits).float().cpu().numpy()

    @property
    def mixes(self) -> bool:
        """(CachedLM.mixes) Not with digit places, whose run of digits is each row's state.
        A mixed pass runs eagerly: `compile` traces a one-token step's block."""
        return super().mixes and packs(self.model.cfg)

    def _packed_logits(self, packed: Packed) -> np.ndarray:
        packed.make_room()
        packed.convert_masks(self._tensor)
        with torch.inference_mode(), generation_attention(self.device), self._steered():
            logits, _ = self.forward(self._tensor(packed.idx), cache=packed, last_only=True,
                                     pos_ids=self._tensor(packed.pos))
        return logits[0].float().cpu().numpy()

    def _steered(self) -> AbstractContextManager:
        """The pass's steering (`additions`, sheepop.generation.steering): a hook at each
        steered block's output adding its array, in the model's dtype; none without any."""
        if not self.additions:
            return nullcontext()
        dtype = self.model.tok_emb.weight.dtype
        added = {point_of(layer): torch.from_numpy(a).to(self.device, dtype)
                 for layer, a in self.additions.items()}
        return hooked(self.model, {point: lambda h, p: h + added[p] for point in added})

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)


def one_block(block: Block, x: torch.Tensor, positions: Positions, pos: Pos,
              cache: KVCache, attn_mask: torch.Tensor | None, values: ValueMix | None
              ) -> torch.Tensor:
    """Block `block` of a one-token step on its own layer's cache (KVCache.layer): the
    function TorchLM.compile compiles once for every layer."""
    return block(x, positions, pos, cache, 0, attn_mask, values)


def generation_attention(device: torch.device) -> AbstractContextManager:
    """The attention kernels a generation step may use: on CUDA, any but cuDNN's.

    cuDNN's attention (what torch picks for bf16/fp16 on an H100/H200) builds an execution
    plan for each new shape, and a decode step's keys are a new shape at every step: on an
    H200, bf16 decoding ran at 19-39 tokens/s over cache lengths it had not seen and 272-304
    once the same lengths came again (float32, which cuDNN does not take, ran at ~330 from the
    start; docs/performance.md, "On a GPU"); without it, bf16 decoded at float32's rate from
    the first token (GPT-2 small 302 against 335). Training's fixed shapes keep cuDNN."""
    if device.type != "cuda":
        return nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def _set_layout(model: GPT, decode_layout: bool) -> None:
    """Store each weight matrix W (out, in) column-major (as the row-major W^T it is multiplied
    by) where sheepop.arch.layout says it pays, or every one back as the usual row-major W."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                if decode_layout and column_major(p.shape):
                    if not p.t().is_contiguous():
                        p.data = p.data.t().contiguous().t()
                elif not p.is_contiguous():
                    p.data = p.data.contiguous()
