"""LoRA in the NumPy engine: the adapted linear layer's hand-written backward (dA, dB, dx through
the frozen W and the adapter, no dW) against finite differences, the whole model with adapters
against finite differences and torch autograd in float64, merging, and the start at B = 0 in
both engines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scratch_gradcheck import check, numerical_grad, rel_error
from variants import ALL_LORA_TARGETS, gqa, llama

from sheepop.arch.lora import LoraConfig, adapter_shapes, init_adapters, is_adapter, merge
from sheepop.config.schema import ModelConfig
from sheepop.model import GPT as TorchGPT
from sheepop.model import LoRALinear, adapter_weights, add_lora, merge_lora
from sheepop.scratch import layers as L
from sheepop.scratch.gpt import gpt_forward
from sheepop.scratch.init import init_params
from sheepop.scratch.lora import (
    FROZEN,
    Adapter,
    LoraGPT,
    lora_backward,
    lora_forward,
    lora_linear_forward,
    lora_linear_grads,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPES = {
    "gpt": dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16, d_ff=24,
                pos_encoding="learned", activation="gelu_tanh"),
    "llama": dict(vocab_size=13, block_size=8, n_layer=2, n_embd=16, d_ff=24,
                  **llama(**gqa(4, 2))),
    "head_bias": dict(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=16, d_ff=24,
                      tie_weights=False, head_bias=True, pos_encoding="learned"),
}
NEW_ROWS = ("tok_emb.new_rows", "head.new_rows", "head.new_bias")


def perturbed(cfg: ModelConfig, lora: LoraConfig, seed: int = 0):
    """Base weights and adapters in float64, every one random (B too: not the start), so that
    no gradient is accidentally zero."""
    rng = np.random.default_rng(seed)
    params = init_params(cfg, seed, np.float64)
    for v in params.values():
        v += rng.standard_normal(v.shape) * (0.2 if v.ndim > 1 else 0.1)
    adapters = {k: rng.standard_normal(s) * 0.3 for k, s in adapter_shapes(cfg, lora).items()}
    return params, adapters


def batch(cfg: ModelConfig, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, cfg.vocab_size, (2, cfg.block_size))
    y = rng.integers(0, cfg.vocab_size, (2, cfg.block_size))
    y[1, -2:] = -1
    return x, y


def torch_lora_model(cfg, params, lora, adapters) -> TorchGPT:
    model = TorchGPT(cfg).double()
    with torch.no_grad():  # float64 exactly (load_numpy_weights goes through float32)
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    return add_lora(model, lora, adapters)


# ----- one layer ---------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_adapter_layer_backward_matches_finite_differences(bias):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5))
    w, b = rng.standard_normal((4, 5)), (rng.standard_normal(4) if bias else None)
    a, bb = rng.standard_normal((2, 5)), rng.standard_normal((4, 2))
    dout = rng.standard_normal((2, 3, 4))
    y, cache = lora_linear_forward(x, w, b, Adapter(a, bb, 1.5))
    np.testing.assert_allclose(y, x @ w.T + (0 if b is None else b) + 1.5 * x @ (bb @ a).T,
                               rtol=1e-13, atol=1e-13)
    dx, grads = lora_linear_grads(dout, cache, "lin")
    assert grads["lin.weight"] is None and grads["lin.bias"] is None  # W and b are frozen
    analytic = {"x": dx, "a": grads["lin.lora_A"], "bb": grads["lin.lora_B"]}
    check(lambda: lora_linear_forward(x, w, b, Adapter(a, bb, 1.5))[0],
          {"x": x, "a": a, "bb": bb}, analytic, dout, tol=1e-8)
    # the identities of docs/finetune.md: dB = s G A^T, dA = s B^T G with G = dy^T x
    G = dout.reshape(-1, 4).T @ x.reshape(-1, 5)
    np.testing.assert_allclose(grads["lin.lora_B"], 1.5 * G @ a.T, rtol=1e-12)
    np.testing.assert_allclose(grads["lin.lora_A"], 1.5 * bb.T @ G, rtol=1e-12)


def test_frozen_layer_without_adapter_gives_dx_only():
    rng = np.random.default_rng(2)
    x, w, b, dout = (rng.standard_normal(s) for s in ((3, 4), (2, 4), (2,), (3, 2)))
    y, cache = lora_linear_forward(x, w, b, FROZEN)
    plain, plain_cache = L.linear_forward(x, w, b)
    assert np.array_equal(y, plain)
    dx, grads = lora_linear_grads(dout, cache, "lin")
    assert grads == {"lin.weight": None, "lin.bias": None}
    np.testing.assert_array_equal(dx, L.linear_backward(dout, plain_cache)[0])


def test_adapter_layer_matches_torch_lora_linear_float32():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w, b = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    a, bb = (rng.standard_normal(s).astype(np.float32) for s in ((3, 6), (5, 3)))
    y, _ = lora_linear_forward(x, w, b, Adapter(a, bb, 0.5))
    assert y.dtype == np.float32
    base = torch.nn.Linear(6, 5)
    with torch.no_grad():
        base.weight.copy_(torch.from_numpy(w))
        base.bias.copy_(torch.from_numpy(b))
    layer = LoRALinear(base, 3, 0.5)
    assert layer.weight is base.weight and layer.bias is base.bias  # the same Parameters
    with torch.no_grad():
        layer.lora_A.copy_(torch.from_numpy(a))
        layer.lora_B.copy_(torch.from_numpy(bb))
        np.testing.assert_allclose(layer(torch.from_numpy(x)).numpy(), y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(layer.merged_weight().numpy(), w + 0.5 * bb @ a, rtol=1e-6)


# ----- the whole model ---------------------------------------------------------------------

@pytest.mark.parametrize("new_tokens", [0, 3])
@pytest.mark.parametrize("shape", SHAPES)
def test_whole_model_adapter_gradients_match_finite_differences(shape, new_tokens):
    cfg = ModelConfig(**SHAPES[shape])
    lora = LoraConfig(2, 3.0, ALL_LORA_TARGETS, new_tokens=new_tokens)
    params, adapters = perturbed(cfg, lora, 4)
    both = {**params, **adapters}
    x, y = batch(cfg, 5)
    _, _, cache = lora_forward(both, cfg, x, y, lora=lora)
    grads = lora_backward(cache)
    assert set(grads) == set(adapters)  # the base model gets no gradient at all

    def loss() -> float:
        return lora_forward(both, cfg, x, y, lora=lora)[1]

    rng = np.random.default_rng(6)
    last = cfg.n_layer - 1
    rows = [n for n in NEW_ROWS if n in adapters]
    assert len(rows) == (0 if not new_tokens else 1 + (not cfg.tie_weights) + cfg.head_bias)
    for name in ("blocks.0.attn.qkv.lora_A", f"blocks.{last}.attn.qkv.lora_B",
                 "blocks.0.attn.proj.lora_B", f"blocks.{last}.ffn.proj.lora_A",
                 *(n for n in adapters if ".ffn.fc." in n or ".ffn.up." in n), *rows):
        idx, num = numerical_grad(loss, adapters[name], 1e-6, max_entries=12, rng=rng)
        assert rel_error(grads[name].reshape(-1)[idx], num) < 1e-6, name


@pytest.mark.parametrize("new_tokens", [0, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_whole_model_with_adapters_matches_torch_autograd_float64(shape, new_tokens):
    cfg = ModelConfig(**SHAPES[shape])
    lora = LoraConfig(3, 5.0, ALL_LORA_TARGETS, new_tokens=new_tokens)
    params, adapters = perturbed(cfg, lora, 7)
    x, y = batch(cfg, 8)
    logits, loss, cache = lora_forward({**params, **adapters}, cfg, x, y, lora=lora)
    grads = lora_backward(cache)

    model = torch_lora_model(cfg, params, lora, adapters)
    t_logits, t_loss = model(torch.from_numpy(x), torch.from_numpy(y))
    t_loss.backward()
    np.testing.assert_allclose(logits, t_logits.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert loss == pytest.approx(t_loss.item(), rel=1e-12)
    t_grads = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
    assert set(t_grads) == set(grads) == set(adapters)  # frozen: torch computed no gradient
    for name, g in grads.items():
        assert rel_error(g, t_grads[name]) < 1e-9, name
    frozen = [p for n, p in model.named_parameters() if not is_adapter(n)]
    assert frozen and all(not p.requires_grad and p.grad is None for p in frozen)


def test_adapters_without_their_config_are_an_error():
    cfg = ModelConfig(**SHAPES["gpt"])
    params, adapters = perturbed(cfg, LoraConfig(2, 2.0, ALL_LORA_TARGETS))
    with pytest.raises(ValueError, match="pass their LoraConfig"):
        gpt_forward({**params, **adapters}, cfg, batch(cfg, 0)[0])


@pytest.mark.parametrize("shape", SHAPES)
def test_merged_weights_give_the_unmerged_logits_in_both_engines(shape):
    cfg = ModelConfig(**SHAPES[shape])
    lora = LoraConfig(4, 8.0, ("qkv", "fc"), new_tokens=2)
    params, adapters = perturbed(cfg, lora, 9)
    x, _ = batch(cfg, 10)
    unmerged, _, _ = lora_forward({**params, **adapters}, cfg, x, lora=lora)
    merged_weights = merge(params, adapters, lora)
    merged, _, _ = gpt_forward(merged_weights, cfg, x)
    np.testing.assert_allclose(merged, unmerged, rtol=0, atol=1e-12)
    base, _, _ = gpt_forward(params, cfg, x)
    assert np.abs(base - unmerged).max() > 0.1  # the adapters do change the model

    model = torch_lora_model(cfg, params, lora, adapters).eval()
    with torch.no_grad():
        t_unmerged = model(torch.from_numpy(x))[0].numpy()
        merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in model.modules())
        assert all(p.requires_grad for p in model.parameters())
        t_merged = model(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(t_unmerged, unmerged, rtol=0, atol=1e-11)
    np.testing.assert_allclose(t_merged, t_unmerged, rtol=0, atol=1e-12)
    names = {n for n, _ in model.named_parameters()}
    assert names == set(params)  # a plain model again, with the checkpoint's names
    np.testing.assert_array_equal(merged_weights["tok_emb.weight"][-2:],
                                  adapters["tok_emb.new_rows"])
    np.testing.assert_array_equal(merged_weights["tok_emb.weight"][:-2],
                                  params["tok_emb.weight"][:-2])
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), merged_weights[name], rtol=0, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES)
def test_fresh_adapters_start_exactly_at_the_base_model(shape):
    cfg = ModelConfig(**SHAPES[shape])
    lora = LoraConfig(8, 16.0, ALL_LORA_TARGETS, new_tokens=3)
    params = init_params(cfg, 0, np.float32)
    x, _ = batch(cfg, 11)
    base, _, _ = gpt_forward(params, cfg, x)
    numpy_lora = LoraGPT(cfg, params, np.float32, seed=5, lora=lora)
    assert np.array_equal(numpy_lora.forward(x)[0], base)
    assert set(numpy_lora.grads) == set(adapter_shapes(cfg, lora))
    assert numpy_lora.trainable_params() == sum(v.size for v in numpy_lora.grads.values())

    model = TorchGPT(cfg)
    model.load_numpy_weights(params)
    with torch.no_grad():
        t_base = model(torch.from_numpy(x))[0].numpy()
    weight = model.blocks[0].attn.qkv.weight
    add_lora(model, lora, seed=5)
    assert model.blocks[0].attn.qkv.weight is weight  # the same Parameter, under the same name
    names = [n for n, _ in model.named_parameters()]
    assert "blocks.0.attn.qkv.weight" in names and "blocks.0.ffn.proj.lora_A" in names
    with torch.no_grad():
        assert np.array_equal(model(torch.from_numpy(x))[0].numpy(), t_base)
    # both engines drew the same A (the shared init), B = 0
    fresh = init_adapters(cfg, lora, seed=5, weights=params)
    np.testing.assert_array_equal(fresh["tok_emb.new_rows"], params["tok_emb.weight"][-3:])
    torch_adapters = adapter_weights(model)
    assert set(torch_adapters) == set(fresh)
    for name, value in fresh.items():
        assert np.array_equal(torch_adapters[name], value)
        assert np.array_equal(numpy_lora.params[name], value)
    with pytest.raises(ValueError, match="not a plain linear layer"):
        add_lora(model, lora)
