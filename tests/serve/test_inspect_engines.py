"""sheepop.inference.load.inspect: attention weights, logit lens, next-token distributions and the
positional encoding of one prompt, equal to the engine's own numbers and to a hand-written
NumPy reference, in both engines. Every distribution is the sampler's: the never-generated ids
(padding, BOS, unknown) at probability 0."""

import math

import numpy as np
import pytest
import torch
from serve_helpers import weights
from variants import llama

from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.inference.load import build, inspect
from sheepop.model import GPT
from sheepop.model.hooks import hooked
from sheepop.positional import place_rope_frequencies, rope_frequencies, sinusoidal_table
from sheepop.scratch import gpt_forward
from sheepop.softmax import softmax
from sheepop.tokenizers import train_tokenizer

TEXT = "the cat sat on the mat. "
KINDS = {  # the layer kinds each change what inspect reads
    "gpt": dict(pos_encoding="sinusoidal"),
    "learned": dict(pos_encoding="learned", head_bias=True),
    "llama": llama(n_kv_head=1),
    "capped": dict(pos_encoding="learned", activation="relu2", logit_softcap=1.5),  # the lens too
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer("char", [TEXT], 0)


def config(tokenizer, kind: str) -> Config:
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2,
                            n_embd=16, **KINDS[kind])
    return cfg


def sampled_softmax(z, never):
    """softmax(z) in float64 with the never-generated ids' logits at -inf (next_token's rule)."""
    z = np.array(z, dtype=np.float64)
    z[..., list(never)] = -np.inf
    return softmax(z)


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def reference_layer0(cfg: ModelConfig, w: dict, ids: list[int]):
    """(first layer's attention (H, T, T), the lens of h_0 (T, V)) by hand in float64, for the
    gpt kind: h_0 = E[x] + s P, LayerNorm, [Q; K; V] = x W^T + b, softmax(Q K^T / sqrt(d_k) + M)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    T, H, dk = len(ids), cfg.n_head, cfg.head_dim
    h0 = w["tok_emb.weight"][ids] + cfg.sinusoid_scale * sinusoidal_table(T, cfg.n_embd)
    x = layernorm(h0, w["blocks.0.ln1.weight"], w["blocks.0.ln1.bias"], cfg.ln_eps)
    qkv = x @ w["blocks.0.attn.qkv.weight"].T + w["blocks.0.attn.qkv.bias"]
    q, k = (qkv[:, i * H * dk:(i + 1) * H * dk].reshape(T, H, dk).transpose(1, 0, 2)
            for i in (0, 1))
    s = q @ k.transpose(0, 2, 1) / math.sqrt(dk) + np.triu(np.full((T, T), -np.inf), 1)
    a = np.exp(s - s.max(-1, keepdims=True))
    lens0 = layernorm(h0, w["ln_f.weight"], w["ln_f.bias"], cfg.ln_eps) @ w["tok_emb.weight"].T
    return a / a.sum(-1, keepdims=True), lens0


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_attention_is_the_engines_own(tokenizer, engine, kind):
    cfg = config(tokenizer, kind)
    w = weights(cfg.model)
    ids = tokenizer.encode("the cat sat on")
    x = inspect(build(cfg, w, tokenizer, engine, "cpu"), ids)
    if engine == "torch":
        model = GPT(cfg.model).eval()
        model.load_numpy_weights(w)
        seen = {}
        keep = lambda a, point: seen.__setitem__(point, a[0].numpy())  # noqa: E731
        with torch.no_grad(), hooked(model, {f"blocks.{i}.attn.pattern": keep
                                             for i in range(cfg.model.n_layer)}):
            model(torch.tensor([ids]))
        own = list(seen.values())
    else:
        _, _, cache = gpt_forward(w, cfg.model, np.array([ids]))
        own = [b.attn.core.a[0] for b in cache.blocks]
    assert list(x.attention) == list(range(cfg.model.n_layer))
    for mine, theirs in zip(x.attention.values(), own):
        assert mine.shape == (cfg.model.n_head, len(ids), len(ids))
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-6)
        assert np.all(np.triu(mine, 1) == 0)  # the causal triangle
        np.testing.assert_allclose(mine.sum(-1), 1, atol=1e-6)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_first_layer_and_the_lens_of_the_embedding_equal_a_hand_written_reference(
        tokenizer, engine):
    cfg = config(tokenizer, "gpt")
    w = weights(cfg.model)
    ids = tokenizer.encode("the mat")
    model = build(cfg, w, tokenizer, engine, "cpu")
    assert len(model.lm.never_generate) == 3  # the char tokenizer's padding, BOS, unknown
    x = inspect(model, ids, k=4)
    attention, lens0 = reference_layer0(cfg.model, w, ids)
    np.testing.assert_allclose(x.attention[0], attention, atol=1e-6)
    p0 = sampled_softmax(lens0, model.lm.never_generate)
    top = np.argsort(-p0, axis=-1)[:, :4]
    np.testing.assert_array_equal(x.lens.ids[0], top)
    np.testing.assert_allclose(x.lens.probs[0], np.take_along_axis(p0, top, -1), atol=1e-6)
    np.testing.assert_allclose(x.lens_next[0][:-1], p0[np.arange(len(ids) - 1), ids[1:]],
                               atol=1e-6)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_last_layers_lens_is_the_models_next_token_distribution(tokenizer, engine, kind):
    cfg = config(tokenizer, kind)
    model = build(cfg, weights(cfg.model), tokenizer, engine, "cpu")
    ids = tokenizer.encode("the cat sat")
    x = inspect(model, ids, k=5)
    # The logits generation reads, one token at a time through the KV cache: the same sums in
    # another order, so float32 rounding differs by ~1e-6.
    p = sampled_softmax(model.lm.prompt_logits(ids), model.lm.never_generate)
    top = np.argsort(-p, axis=-1)[:, :5]
    np.testing.assert_array_equal(x.next.ids, top)
    np.testing.assert_allclose(x.next.probs, np.take_along_axis(p, top, -1), atol=1e-5)
    np.testing.assert_allclose(x.lens_next[-1][:-1], p[np.arange(len(ids) - 1), ids[1:]],
                               atol=1e-5)
    assert np.isnan(x.lens_next[:, -1]).all()  # nothing follows the prompt's last token
    assert x.lens.ids.shape == (cfg.model.n_layer + 1, len(ids), 5)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_each_layers_rank_entropy_and_kl_to_the_final_distribution(tokenizer, engine):
    """Per layer and position: the rank of the prompt's next token (1 + the tokens scoring
    more), H(p_l) = -sum p ln p and KL(p_L || p_l) = sum p_L ln(p_L / p_l), against float64
    sums over the whole (never-excluded) distribution of each layer's lens; and the final
    logits of one position, the sampler's input."""
    cfg = config(tokenizer, "llama")
    model = build(cfg, weights(cfg.model), tokenizer, engine, "cpu")
    ids = tokenizer.encode("the cat sat on")
    x = inspect(model, ids, k=3, logits_at=[2])
    never = model.lm.never_generate
    if engine == "numpy":
        from sheepop.scratch.capture import trace
    else:
        from sheepop.model.capture import trace
    t = trace(model.lm, ids, layers=())
    logits = [np.array(t.lens(h), dtype=np.float64) for h in t.residuals]
    final = sampled_softmax(logits[-1], never)
    for layer, z in enumerate(logits):
        p = sampled_softmax(z, never)
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.where(p > 0, p * np.log(p), 0).sum(-1)
            kl = np.where(final > 0, final * (np.log(final) - np.log(p)), 0).sum(-1)
        np.testing.assert_allclose(x.lens_entropy[layer], entropy, atol=1e-5)
        np.testing.assert_allclose(x.lens_kl[layer], kl, atol=1e-5)
        z = z.copy()
        z[:, list(never)] = -np.inf
        rank = [1 + int((z[i] > z[i, ids[i + 1]]).sum()) for i in range(len(ids) - 1)]
        assert x.lens_rank[layer].tolist() == rank + [0]
    assert np.all(x.lens_kl[-1] < 1e-6) and np.all(x.lens_rank[-1][:-1] >= 1)
    np.testing.assert_allclose(x.next_entropy, x.lens_entropy[-1])
    assert list(x.logits) == [2]
    np.testing.assert_allclose(x.logits[2], model.lm.prompt_logits(ids)[2]
                               + np.where(np.isin(np.arange(len(final[0])), never), -np.inf, 0),
                               atol=1e-5)


def test_both_engines_inspect_the_same_numbers(tokenizer):
    cfg = config(tokenizer, "llama")
    w = weights(cfg.model)
    ids = tokenizer.encode("on the mat.")
    a, b = (inspect(build(cfg, w, tokenizer, e, "cpu"), ids) for e in ("torch", "numpy"))
    for x, y in zip(a.attention, b.attention):
        np.testing.assert_allclose(x, y, atol=1e-5)
    np.testing.assert_array_equal(a.lens.ids, b.lens.ids)
    np.testing.assert_allclose(a.lens.probs, b.lens.probs, atol=1e-5)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_positional_encoding_in_use(tokenizer, engine, kind):
    cfg = config(tokenizer, kind)
    m, w = cfg.model, weights(cfg.model)
    T = 5
    x = inspect(build(cfg, w, tokenizer, engine, "cpu"), tokenizer.encode("the c"))
    assert x.positions_kind == m.pos_encoding
    if kind == "gpt":
        expected, width = m.sinusoid_scale * sinusoidal_table(T, m.n_embd), m.n_embd
    elif m.pos_encoding == "learned":
        expected, width = w["pos_emb.weight"][:T], m.n_embd
    else:  # rope: t * theta^(-2i/d_k)
        expected = np.arange(T)[:, None] * rope_frequencies(m.head_dim, m.rope_theta)[None]
        width = m.head_dim // 2
    np.testing.assert_allclose(x.positions, expected, atol=1e-6)
    assert x.position_columns == width


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_a_prompt_must_fit_in_the_context(tokenizer, engine):
    cfg = config(tokenizer, "gpt")
    model = build(cfg, weights(cfg.model), tokenizer, engine, "cpu")
    assert inspect(model, [1] * 16).attention[0].shape == (2, 16, 16)  # the whole context
    for ids in ([1] * 17, []):
        with pytest.raises(UserError, match="1 to 16 tokens"):
            inspect(model, ids)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos_encoding", ["rope_terms", "rope_places", "none"])
def test_the_digit_position_kinds_are_shown_too(engine, pos_encoding):
    """rope_terms turns by the index of each token's number ("0042 0049" -> 0 0 0 0 1 1 1 1 1);
    `none` has no table at all."""
    digits = train_tokenizer("digits", ["0042 0049 "])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=digits.vocab_size, block_size=16, n_layer=1, n_head=2,
                            n_embd=16, pos_encoding=pos_encoding)
    ids = digits.encode("0042 0049")
    x = inspect(build(cfg, weights(cfg.model), digits, engine, "cpu"), ids)
    assert x.positions_kind == pos_encoding and len(x.attention) == 1
    if pos_encoding == "none":
        assert x.positions.shape == (9, 0) and x.position_columns == 0
    else:
        terms = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1], dtype=np.float64)[:, None]
        if pos_encoding == "rope_places":  # (term index, digit place) pairs, turned by W
            places = np.array([1, 2, 3, 4, 0, 1, 2, 3, 4], dtype=np.float64)[:, None]
            w = place_rope_frequencies(8)
            np.testing.assert_allclose(x.positions, terms * w[0] + places * w[1], atol=1e-12)
        else:
            np.testing.assert_allclose(x.positions, terms * rope_frequencies(8)[None],
                                       atol=1e-12)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_only_the_layers_asked_are_kept(tokenizer, engine, kind):
    """A trace holds the attention weights of the layers asked and no others (every layer's,
    kept at once, ran a server out of 16 GB on a 3,782-token prompt of SmolLM2: the page's
    logit-lens request asks for none); the weights asked and everything else are the same as
    with every layer kept, the probabilities to the last bit (the page's views ask for
    different layers and show one p per token). A one-token prompt of grouped-query heads
    (the NumPy engine's grouped decode path) has its H rows too."""
    cfg = config(tokenizer, kind)
    model = build(cfg, weights(cfg.model), tokenizer, engine, "cpu")
    ids = tokenizer.encode("the cat sat")
    every = inspect(model, ids, k=3)
    one = inspect(model, ids, k=3, layers=[1])
    assert list(every.attention) == [0, 1] and list(one.attention) == [1]
    np.testing.assert_allclose(one.attention[1], every.attention[1], atol=1e-6)
    np.testing.assert_array_equal(one.lens.probs, every.lens.probs)  # to the last bit: one
    none = inspect(model, ids, k=3, layers=[], logits_at=[2])  # the page's lens request
    assert none.attention == {}  # and one p per token on every view, the logits too:
    np.testing.assert_array_equal(none.lens.probs, every.lens.probs)
    np.testing.assert_array_equal(none.logits[2], inspect(model, ids, logits_at=[2]).logits[2])
    assert inspect(model, ids[:1]).attention[1].shape == (2, 1, 1)
