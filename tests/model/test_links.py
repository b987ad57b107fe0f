"""model.value_embeds and model.unet_skips in the whole model (the units' gradients:
tests/scratch/test_value_embeds_skips.py; the whole model's against finite differences and
autograd: test_scratch_model_grad.py, test_scratch_vs_torch.py). Here: the KV cache gives the
full forward's logits in both engines, the trace and the lens follow them, both engines train
with them step for step, their parameters' optimizer groups, and the refusals by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from kv_cache_check import assert_the_cache_gives_the_full_forward
from variants import ROPE, gqa

from sheepop.arch.links import skip_links, value_links
from sheepop.arch.params import decays, init_rule, uses_muon
from sheepop.config.schema import Config, ModelConfig, TrainConfig
from sheepop.errors import UserError
from sheepop.inference.load import build, inspect
from sheepop.interop.gpt2 import check_gpt2_shaped
from sheepop.interop.llama import check_llama_shaped
from sheepop.model import GPT
from sheepop.schedule import lr_at
from sheepop.scratch import gpt_forward
from sheepop.scratch.init import init_params, param_shapes
from sheepop.scratch.token_steps import trace_token
from sheepop.tokenizers import train_tokenizer
from sheepop.train.engine_numpy import NumpyEngine
from sheepop.train.engine_torch import TorchEngine

CFG = ModelConfig(vocab_size=23, block_size=16, n_layer=5, n_embd=32, value_embeds=2,
                  unet_skips=True, bias=False, **ROPE, **gqa(4, 2))


def big_weights(cfg: ModelConfig, seed: int = 1) -> dict[str, np.ndarray]:
    """Weights far from init, lambdas and skip weights too, so every link carries weight."""
    params = init_params(cfg, 0)
    rng = np.random.default_rng(seed)
    for v in params.values():
        v += (rng.standard_normal(v.shape) * (0.5 if v.ndim > 1 else 0.3)).astype(v.dtype)
    return params


def test_the_layout_of_the_links():
    assert value_links(CFG) == [(0, 0), (1, 1), None, (0, 2), (1, 3)]  # 01 . 01
    assert skip_links(CFG) == [None, None, None, (1, 0), (0, 1)]      # 1 -> 3, 0 -> 4
    shapes = param_shapes(CFG)
    assert {k: v for k, v in shapes.items() if k.startswith(("value_embeds", "skips"))} == {
        "value_embeds.0.weight": (23, 16), "value_embeds.1.weight": (23, 16),  # H_kv d_k = 2 8
        "value_embeds.lambdas": (4,), "skips.weights": (2,)}
    assert set(GPT(CFG).numpy_weights()) == set(shapes)  # the same names in both engines


def test_they_change_the_logits_and_the_kv_cache_gives_the_full_forwards_in_both_engines():
    w = big_weights(CFG)
    x = np.random.default_rng(2).integers(0, CFG.vocab_size, (2, 12))
    full = assert_the_cache_gives_the_full_forward(w, CFG, x)
    plain = ModelConfig(**{**CFG.__dict__, "value_embeds": 0, "unet_skips": False})
    unlinked = gpt_forward({k: v for k, v in w.items() if k in param_shapes(plain)}, plain, x)[0]
    assert np.abs(full - unlinked).max() > 0.1  # (the links are not a no-op here)


def test_the_trace_follows_them():
    w = big_weights(CFG)
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    reference = gpt_forward(w, CFG, np.asarray([ids]))[0][0]
    traces = [trace_token(w, CFG, ids, 6, layer) for layer in range(CFG.n_layer)]
    for x in traces:
        assert np.abs(x.logits - reference[6]).max() < 1e-4
    # block 3 takes block 1's output: its input is block 2's output plus w_0 times it
    np.testing.assert_allclose(traces[3].h_in, traces[2].x2 + w["skips.weights"][0]
                               * traces[1].x2, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(traces[2].h_in, traces[1].x2)  # the middle block takes none
    # layer 4 reads table 1 with lambda 3: a head's value at t is lam v + (1 - lam) T_1[x_t]
    head = traces[4].heads[0]
    lam, row = w["value_embeds.lambdas"][3], w["value_embeds.1.weight"][ids[6], :8]
    y = traces[4].norm1.y  # the value heads' pre-mix values, recomputed from the block input
    v_pre = (y @ w["blocks.4.attn.qkv.weight"].T)[48:56]  # after 4 query and 2 key heads of 8
    np.testing.assert_allclose(head.v, lam * v_pre + (1 - lam) * row, rtol=1e-5, atol=1e-6)


def test_the_lens_reads_the_same_stream_in_both_engines():
    tokenizer = train_tokenizer("char", ["the cat sat on the mat. "], 0)
    cfg = Config()
    cfg.model = dataclasses.replace(CFG, vocab_size=tokenizer.vocab_size)
    w = big_weights(cfg.model)
    ids = tokenizer.encode("the cat sat")
    seen = {e: inspect(build(cfg, w, tokenizer, e, "cpu"), ids) for e in ("torch", "numpy")}
    # entropies of every layer's lens, in nats: equal to float32 rounding of a 14-token softmax
    np.testing.assert_allclose(seen["torch"].lens_entropy, seen["numpy"].lens_entropy,
                               rtol=0, atol=1e-4)
    np.testing.assert_allclose(seen["torch"].lens_kl[-1], 0, atol=1e-5)  # h_L: the model's own


TCFG = TrainConfig(steps=20, lr=1e-2, min_lr=1e-3, warmup_steps=2, weight_decay=0.1,
                   grad_clip=1.0, device="cpu", seed=3, optimizer="muon", muon_lr=0.02,
                   muon_ns_dtype="float32", dtype="float64")


def test_the_numpy_engine_trains_with_them_as_the_torch_engine_does():
    cfg = dataclasses.replace(CFG, n_embd=16, vocab_size=13, block_size=8)
    weights = init_params(cfg, 0, np.float64)
    ours = NumpyEngine(cfg, TCFG, weights)
    theirs = TorchEngine(cfg, dataclasses.replace(TCFG, dtype="float32"), weights)
    theirs.model.double()  # in place: the optimizers keep the same Parameters
    with torch.no_grad():
        for name, p in theirs.model.named_parameters():
            p.copy_(torch.from_numpy(weights[name]))
    losses = []
    for step in range(TCFG.steps):
        x = np.random.default_rng(100 + step % 5).integers(0, cfg.vocab_size, (3, 8))
        micro = [(x, (x + 1) % cfg.vocab_size)]  # the token after x is x + 1
        lr = lr_at(step, TCFG.lr, TCFG.min_lr, TCFG.warmup_steps, TCFG.steps)
        a, b = ours.train_step(micro, lr)[0], theirs.train_step(micro, lr)[0]
        assert abs(a - b) <= 1e-9 * abs(b), (step, a, b)
        losses.append(a)
    assert losses[-1] < 0.7 * losses[0]
    trained = ours.model.params
    for name in ("value_embeds.lambdas", "skips.weights"):  # they learn (AdamW's steps)
        assert np.abs(trained[name] - weights[name]).max() > 1e-2, name


def test_their_parameters_go_to_adamw_and_start_as_modded_nanogpt():
    for name, shape in param_shapes(CFG).items():
        if name.startswith(("value_embeds.", "skips.")):
            assert not uses_muon(name, shape), name
            assert decays(shape) == name.endswith(".weight"), name  # tables as the token table
    assert init_rule("value_embeds.lambdas", 5) == ("fill", 0.5)
    assert init_rule("skips.weights", 5)[0] == "ones"
    model = GPT(CFG)
    assert model.value_embeds.lambdas.tolist() == [0.5] * 4
    assert model.skips.weights.tolist() == [1.0, 1.0]


def test_exports_refuse_them_by_name():
    llama_kw = dict(pos_encoding="rope", norm="rmsnorm", ffn="swiglu", activation="silu",
                    bias=False)
    with pytest.raises(UserError, match="model.value_embeds=1 .Llama's values come"):
        check_llama_shaped(ModelConfig(**llama_kw, value_embeds=1))
    with pytest.raises(UserError, match="model.unet_skips=true .Llama has no skips"):
        check_llama_shaped(ModelConfig(**llama_kw, unet_skips=True))
    gpt2 = dict(pos_encoding="learned", activation="gelu_tanh")
    with pytest.raises(UserError, match="model.value_embeds=2 .GPT-2's values come"):
        check_gpt2_shaped(ModelConfig(**gpt2, value_embeds=2))
    with pytest.raises(UserError, match="model.unet_skips=true .GPT-2 has no skips"):
        check_gpt2_shaped(ModelConfig(**gpt2, unet_skips=True))


def test_more_tables_than_half_the_layers_is_refused_in_one_line():
    cfg = Config()
    cfg.model = ModelConfig(n_layer=5, value_embeds=3)
    with pytest.raises(UserError, match=r"model.value_embeds must be 0 to n_layer / 2 \(2\)"):
        cfg.validate()
