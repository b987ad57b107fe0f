import numpy as np
import pytest
import torch
from variants import ROPE

from sheepop.config.schema import ModelConfig, SampleConfig
from sheepop.generation.generate import generate
from sheepop.model import GPT, TorchLM
from sheepop.model.hooks import hooked
from sheepop.positional import sinusoidal_table


def test_sdpa_and_explicit_attention_agree(small_cfg):
    torch.manual_seed(0)
    model = GPT(small_cfg).eval()
    x = torch.randint(0, small_cfg.vocab_size, (3, small_cfg.block_size))
    fast, _ = model(x)
    model.set_attention_path(sdpa=False)
    weights = {}
    with hooked(model, {"blocks.0.attn.pattern": lambda a, point: weights.update(a=a)}):
        slow, _ = model(x)
    assert torch.allclose(fast, slow, atol=1e-6, rtol=0)
    w = weights["a"]
    assert w.shape == (3, 4, 32, 32)
    assert torch.allclose(w.sum(-1), torch.ones(3, 4, 32))
    assert torch.all(w.triu(diagonal=1) == 0)  # causal: nothing above the diagonal


@pytest.mark.parametrize("overrides", [
    {}, {"pos_encoding": "learned"}, {"activation": "relu", "n_head": 1},
    {"activation": "gelu_tanh", "tie_weights": False, "head_bias": True, "bias": False},
])
def test_parameter_names_follow_the_contract(small_cfg, overrides):
    cfg = ModelConfig(**{**small_cfg.__dict__, **overrides})
    names = set(GPT(cfg).numpy_weights())
    expected = {"tok_emb.weight", "ln_f.weight", "ln_f.bias"}
    for i in range(cfg.n_layer):
        expected |= {f"blocks.{i}.{n}" for n in ("ln1.weight", "ln1.bias", "ln2.weight",
                                                  "ln2.bias", "attn.qkv.weight", "attn.proj.weight",
                                                  "ffn.fc.weight", "ffn.proj.weight")}
        if cfg.bias:
            expected |= {f"blocks.{i}.{n}" for n in ("attn.qkv.bias", "attn.proj.bias",
                                                      "ffn.fc.bias", "ffn.proj.bias")}
    if cfg.pos_encoding == "learned":
        expected.add("pos_emb.weight")
    if not cfg.tie_weights:
        expected.add("head.weight")
    if cfg.head_bias:
        expected.add("head.bias")
    assert names == expected


def test_parameter_count_of_a_known_shape():
    # V=10, T=8, d=4, 1 layer, d_ff=16, tied, biases: 40 + 2*(4+4) + (48+12) + (16+4) + (64+16)
    # + (64+4) + (4+4) = 40 + 16 + 60 + 20 + 80 + 68 + 8 = 292
    cfg = ModelConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=4)
    assert GPT(cfg).num_params() == 292


def test_sinusoidal_table_values():
    P = sinusoidal_table(3, 4)
    assert P[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert P[1] == pytest.approx([np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)])
    assert P[2, 2] == pytest.approx(np.sin(2 / 100))


def test_residual_projections_are_scaled_at_init():
    cfg = ModelConfig(vocab_size=50, block_size=8, n_layer=8, n_head=4, n_embd=256)
    torch.manual_seed(0)
    model = GPT(cfg)
    std = model.blocks[0].attn.proj.weight.std().item()
    assert std == pytest.approx(0.02 / 4, rel=0.05)  # 0.02 / sqrt(2 * 8)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("ffn", ["mlp", "swiglu"])
def test_zero_init_proj_starts_every_block_as_the_identity(ffn):
    """model.zero_init_proj: attn.proj and ffn.proj start at 0 in both engines (the NumPy
    engine's init_params too), so the logits are the embedding's through ln_f and the head, and
    the first backward reaches nothing before the projections."""
    from sheepop.scratch.init import init_params
    cfg = ModelConfig(vocab_size=50, block_size=8, n_layer=2, n_head=4, n_embd=32, ffn=ffn,
                      pos_encoding="rope", zero_init_proj=True)  # (rope: nothing added to x)
    torch.manual_seed(0)
    model = GPT(cfg)
    arrays = init_params(cfg, 0)
    for name, p in model.named_parameters():
        projection = name.endswith(("attn.proj.weight", "ffn.proj.weight"))
        assert bool(torch.all(p == 0)) == projection or name.endswith("bias"), name
        assert bool(np.all(arrays[name] == 0)) == projection or name.endswith("bias"), name
    x = torch.randint(0, 50, (2, 8))
    logits, loss = model(x, x)
    table = model.tok_emb.table()
    expected = model.head(model.ln_f(torch.nn.functional.embedding(x, table)), table)
    assert torch.allclose(logits, expected, atol=1e-6, rtol=0)
    loss.backward()
    for name, p in model.named_parameters():
        if name.startswith("blocks.") and not name.endswith(("proj.weight", "proj.bias")):
            assert p.grad is None or bool(torch.all(p.grad == 0)), name
        if name.endswith("proj.weight"):
            assert float(p.grad.abs().max()) > 0, name


def test_kv_cache_logits_equal_full_forward(small_cfg):
    torch.manual_seed(1)
    model = GPT(small_cfg).eval()
    x = torch.randint(0, small_cfg.vocab_size, (2, 20))
    full, _ = model(x)
    cache = model.new_cache(batch=2)
    parts = [model(x[:, :7], cache=cache)[0]]
    parts += [model(x[:, t:t + 1], cache=cache)[0] for t in range(7, 12)]
    parts.append(model(x[:, 12:], cache=cache)[0])  # a multi-token chunk after the cache
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_cached_and_uncached_greedy_generation_agree_for_200_tokens():
    cfg = ModelConfig(vocab_size=37, block_size=256, n_layer=2, n_head=4, n_embd=32)
    torch.manual_seed(2)
    lm = TorchLM(GPT(cfg))
    prompt = [1, 5, 9]
    sc = SampleConfig(max_new_tokens=200, temperature=0)
    cached = [s.token for s in generate(lm, prompt, sc, use_cache=True)]
    plain = [s.token for s in generate(lm, prompt, sc, use_cache=False)]
    assert len(cached) == 200 and cached == plain
    ids = prompt + cached[:150]
    a = lm.prefill(ids[:-1])
    a = lm.decode(ids[-1])
    assert np.allclose(a, lm.full(ids), atol=1e-5, rtol=0)


def test_window_slides_past_the_context_identically(small_cfg):
    torch.manual_seed(3)
    lm = TorchLM(GPT(small_cfg))  # block_size 32, so 80 tokens slide the window
    sc = SampleConfig(max_new_tokens=80, temperature=1.0, top_k=10, seed=7)
    prompt = [i % 37 for i in range(40)]  # longer than the context: cropped to the last 32
    cached = [s.token for s in generate(lm, prompt, sc, use_cache=True)]
    plain = [s.token for s in generate(lm, prompt, sc, use_cache=False)]
    assert cached == plain and len(cached) == 80


def test_loss_ignores_padding_targets(small_cfg):
    torch.manual_seed(4)
    model = GPT(small_cfg).eval()
    x = torch.randint(0, small_cfg.vocab_size, (1, 10))
    y = torch.randint(0, small_cfg.vocab_size, (1, 10))
    _, loss_full = model(x[:, :6], y[:, :6])
    y_pad = y.clone()
    y_pad[:, 6:] = -1
    logits, loss_pad = model(x, y_pad)
    logp = torch.log_softmax(logits[0, :6], -1)
    by_hand = -logp[torch.arange(6), y[0, :6]].mean()
    assert torch.allclose(loss_pad, by_hand, atol=1e-6)
    assert torch.allclose(loss_full, loss_pad, atol=1e-6)  # causal: later inputs change nothing


def test_rope_trains_after_an_evaluation_at_the_same_positions():
    """The rotary angles are computed once per forward pass and reused by the next pass at the
    same positions, but never across inference_mode: an evaluation's tensors cannot be saved
    for a training step's backward."""
    import numpy as np

    from sheepop.config.schema import ModelConfig, TrainConfig
    from sheepop.train.engine_torch import TorchEngine
    cfg = ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, **ROPE)
    engine = TorchEngine(cfg, TrainConfig(device="cpu", dtype="float32", seed=0))
    x = np.random.default_rng(0).integers(0, 11, (2, 8))
    before, _ = engine.eval_loss(x, x)
    engine.train_step([(x, x)], 1e-2)
    after, _ = engine.eval_loss(x, x)
    assert after < before
