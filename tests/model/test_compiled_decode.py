"""The compiled decode step (`--compile`, TorchLM.compile): one block's graph for every layer,
logits equal to the eager step's within each dtype's precision (float32, the two narrow
formats read as stored, int8 and int4, and bfloat16, whose compiled products are a loop of
their own: sheepop.model.bf16_products). Each compilation costs tens of seconds of the suite's
two cores, so these are few; that a second start reads inductor's on-disk cache is torch's own
behaviour, measured in docs/performance.md, not tested here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from variants import gqa, llama

from sheepop.config.schema import Config, ModelConfig
from sheepop.inference.load import build
from sheepop.model import quantized
from sheepop.scratch.init import init_params

N_LAYER = 3


def small_config() -> Config:
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=61, block_size=64, n_layer=N_LAYER, n_embd=64,
                            dropout=0.0, **llama(tie_weights=True, **gqa(4, 2)))
    return cfg


def _compile_recording(lm) -> tuple[list[torch.fx.GraphModule], list[int]]:
    """Compile `lm`'s decode step with a backend that runs dynamo's graphs as they are (no
    inductor); (the graphs it was given, one entry per call of any of them), both filling as
    `lm` compiles and decodes."""
    graphs, calls = [], []

    def backend(graph, example_inputs):
        graphs.append(graph)

        def run(*args):
            calls.append(1)
            return graph.forward(*args)
        return run

    torch._dynamo.reset()
    lm.compile(backend=backend)
    return graphs, calls


def test_every_layer_of_a_decode_step_runs_one_graph():
    """Given the whole cache and its layer's index, each layer was a graph of its own (the
    index a constant of the graph): n_layer compilations, past dynamo's limit of 8 on a real
    model. Each layer now gets its own layer's cache: one graph, called n_layer times a step."""
    cfg = small_config()
    lm = build(cfg, init_params(cfg.model, 0), None, "torch", "cpu").lm
    graphs, calls = _compile_recording(lm)  # compiles on a scratch cache: one decode step
    assert len(graphs) == 1 and len(calls) == N_LAYER
    token = int(lm.prefill([1, 2, 3]).argmax())  # the prompt runs eagerly
    for _ in range(5):
        token = int(lm.decode(token).argmax())
    assert len(graphs) == 1 and len(calls) == N_LAYER * 6


def test_an_int8_decode_step_with_the_kernel_is_one_graph_too(monkeypatch):
    """Compiled on a CPU whose int8 product is torch's kernel (not WORDS_LOOP_PAYS: AVX-512),
    each block's seven products call the kernel inside the block's one graph: its guard on the
    storages' alignment (data_ptr, which dynamo cannot trace) broke every product out of the
    graph (5 compiled regions a block, measured on SmolLM2)."""
    monkeypatch.setattr(quantized, "WORDS_LOOP_PAYS", False)
    cfg = small_config()
    lm = build(cfg, init_params(cfg.model, 0), None, "torch", "cpu", "int8").lm
    graphs, calls = _compile_recording(lm)
    token = int(lm.prefill([1, 2, 3]).argmax())
    for _ in range(5):
        token = int(lm.decode(token).argmax())
    kernel = torch.ops.aten._weight_int8pack_mm
    kernels = [sum(n.target in (kernel, kernel.default) for n in g.graph.nodes) for g in graphs]
    # one graph with every product of the block the kernel takes (both sizes multiples of
    # 16: here q, k, v, o and one of the feed-forward's); the head's graphs (a vocabulary of
    # 61: the dequantized product) without
    takes = [m for m in lm.model.blocks[0].modules() if isinstance(m, quantized.Int8Linear)
             and m.in_features % 16 == 0 and m.out_features % 16 == 0]
    assert len(takes) >= 4 and sorted(kernels, reverse=True)[:2] == [len(takes), 0], kernels


@pytest.fixture(scope="module")
def weights():
    return init_params(small_config().model, 3)


# How far the compiled step's logits may be from the eager step's, as a fraction of the largest
# |logit|. float32: the same sums in another order, each product of K <= 256 terms off by at
# most K * 2^-24 of its sum of |terms|, over the 4 products of a block and the head. The narrow
# dtypes: the eager step rounds each product's input and output to bf16 (2^-9 each, taken as
# 2^-8), which inductor does not (its default, emulate_precision_casts off): 2 roundings per
# product, 4 products a block, and the head. bfloat16 likewise (its compiled products are
# Bf16Linear's float32 sums; the eager ones bf16 F.linear's).
PRODUCTS = 4 * N_LAYER + 1
TOLERANCE = {"float32": PRODUCTS * 256 * 2 ** -24, "int8": 2 * PRODUCTS * 2 ** -8,
             "int4": 2 * PRODUCTS * 2 ** -8, "bfloat16": 2 * PRODUCTS * 2 ** -8}


@pytest.mark.parametrize("dtype", ["float32", "int8", "int4", "bfloat16"])
def test_compiled_logits_equal_the_eager_ones(weights, dtype):
    """The prompt and six decode steps after it, both fed the eager model's greedy tokens."""
    cfg = small_config()
    eager = build(cfg, dict(weights), None, "torch", "cpu", dtype).lm
    compiled = build(cfg, dict(weights), None, "torch", "cpu", dtype).lm
    compiled.compile()
    assert compiled.model.decode_block is not None
    prompt = [5, 9, 14, 3, 27]
    z_eager, z_compiled = eager.prefill(prompt), compiled.prefill(prompt)
    for step in range(7):  # the prompt's blocks run eagerly; an int8 head is compiled
        gap = np.abs(z_compiled - z_eager).max() / np.abs(z_eager).max()
        assert gap <= TOLERANCE[dtype], (dtype, step, gap)
        token = int(z_eager.argmax())
        z_eager, z_compiled = eager.decode(token), compiled.decode(token)


def test_a_batch_of_padded_rows_decodes_as_eagerly(weights):
    """Rows of different lengths (left padding: each row's positions and a mask of its keys,
    the server's running batch) through the compiled step: the eager step's logits within
    float32's bound."""
    cfg = small_config()
    eager = build(cfg, dict(weights), None, "torch", "cpu").lm
    compiled = build(cfg, dict(weights), None, "torch", "cpu").lm
    compiled.compile()
    rows = [[5, 9, 14, 3, 27], [7, 2, 40]]
    z_eager, z_compiled = eager.prefill_batch(rows), compiled.prefill_batch(rows)
    for _ in range(4):
        tokens = z_eager.argmax(-1).tolist()
        z_eager, z_compiled = eager.decode_batch(tokens), compiled.decode_batch(tokens)
        gap = np.abs(z_compiled - z_eager).max() / np.abs(z_eager).max()
        assert gap <= TOLERANCE["float32"], gap


def test_a_steered_step_runs_eagerly_and_is_steered(weights):
    """Steering adds s v through a hook at a block's output; the compiled function skips
    dynamo's guards on modules (the hook is a module attribute), so a hooked block must run
    eagerly: compiled, the hook would be left out of every step after the first."""
    from sheepop.generation.steering import Steering, SteeringVector

    cfg = small_config()
    vector = SteeringVector(np.random.default_rng(0).standard_normal(64).astype(np.float32),
                            layer=1, model="small", n_layer=N_LAYER)
    eager = build(cfg, dict(weights), None, "torch", "cpu").lm
    compiled = build(cfg, dict(weights), None, "torch", "cpu").lm
    compiled.compile()
    plain = compiled.prefill([5, 9, 14])
    plain = compiled.decode(int(plain.argmax()))  # a compiled step without hooks first
    for lm in (eager, compiled):
        lm.steer(Steering(((vector, 4.0),)))
    z_eager, z_compiled = eager.prefill([5, 9, 14]), compiled.prefill([5, 9, 14])
    for _ in range(3):
        token = int(z_eager.argmax())
        z_eager, z_compiled = eager.decode(token), compiled.decode(token)
        gap = np.abs(z_compiled - z_eager).max() / np.abs(z_eager).max()
        assert gap <= TOLERANCE["float32"], gap
