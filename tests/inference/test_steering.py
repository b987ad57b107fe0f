"""Steering (sheepop.generation.steering, sheepop.inference.steer; docs/steering.md) in both
engines, on a small model with random weights: a vector is the difference of the mean
residuals computed here by running the blocks by hand; strength 0 is no steering to the bit;
strength s adds s v to the stream out of its block; a KV-cached steered decode equals the
steered full recomputation; both engines agree; a batch steered row by row equals each row
alone; the file keeps what it says and refuses a model of another width by name."""

import numpy as np
import pytest
import torch
from float_tolerance import float32_tolerance, model_depth

from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.generation.generate import generate, generate_batch_ids
from sheepop.generation.steering import Steering, SteeringVector, read_vector
from sheepop.inference.load import build
from sheepop.inference.steer import make_vector, read_prompts
from sheepop.model.hooks import hooked as torch_hooked
from sheepop.scratch.hooks import hooked as numpy_hooked
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers.char import CharTokenizer

POSITIVE = ["we love the sun", "love is all", "sun and love, love and sun"]
NEGATIVE = ["a box of rocks", "rocks in a box", "the box"]
TEXT = "".join(POSITIVE + NEGATIVE) + " .,"
LAYER = 1


def model_config(**kw) -> ModelConfig:
    tok = CharTokenizer.train([TEXT])
    return ModelConfig(**{**dict(vocab_size=tok.vocab_size, block_size=48, n_layer=3, n_head=2,
                                 n_embd=16, dropout=0.0), **kw})


def weights(cfg: ModelConfig, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
                + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
            for k, s in param_shapes(cfg).items()}


def models(**kw):
    """The same model in both engines (float32, same weights)."""
    cfg = model_config(**kw)
    w = weights(cfg)
    tok = CharTokenizer.train([TEXT])
    return {e: build(Config(model=cfg), dict(w), tok, e) for e in ("numpy", "torch")}


@pytest.fixture(scope="module")
def both():
    return models()


def by_hand_residual(model, ids, layer):
    """h_(layer+1) (T, d) float64 with the torch modules called one by one, no hooks: the
    embedding and positions, then blocks 0..layer (the model's own forward, cut short)."""
    gpt = model.lm.model
    seen = {}

    def stop_after(module, args, out):
        seen["h"] = out
        raise StopIteration
    handle = gpt.blocks[layer].register_forward_hook(stop_after)
    try:
        with torch.no_grad():
            gpt(torch.tensor([ids]))
    except StopIteration:
        pass
    finally:
        handle.remove()
    return seen["h"][0].double().numpy()


def test_the_vector_is_the_difference_of_the_mean_residuals(both):
    torch_model = both["torch"]
    tok = torch_model.tokenizer

    def mean(prompts, positions):
        rows = []
        for p in prompts:
            h = by_hand_residual(torch_model, tok.encode(p), LAYER)
            rows.append(h[1:].mean(0) if positions == "mean" else h[-1])
        return np.mean(rows, axis=0)
    for positions in ("mean", "last"):
        expected = mean(POSITIVE, positions) - mean(NEGATIVE, positions)
        for engine, model in both.items():
            v = make_vector(model, "tiny", POSITIVE, NEGATIVE, LAYER, positions)
            assert (v.layer, v.model, v.positions, v.positive, v.negative) == \
                (LAYER, "tiny", positions, 3, 3)
            tol = float32_tolerance(16, model_depth(3), np.abs(expected).max())
            np.testing.assert_allclose(v.vector, expected, rtol=0, atol=tol, err_msg=engine)
    # "mean" leaves the first position out: with it the vector differs
    first_in = np.mean([by_hand_residual(torch_model, tok.encode(p), LAYER).mean(0)
                        for p in POSITIVE], 0) - np.mean(
        [by_hand_residual(torch_model, tok.encode(p), LAYER).mean(0) for p in NEGATIVE], 0)
    assert np.abs(first_in - mean(POSITIVE, "mean") + mean(NEGATIVE, "mean")).max() > 1e-3


def steering(model, strength, layer=LAYER):
    v = make_vector(model, "tiny", POSITIVE, NEGATIVE, layer)
    return Steering(((v, strength),)), v


def steps(lm, ids, n=6):
    """Greedy: the logits after the prompt and after each of n tokens, through the cache."""
    out = [lm.prefill(ids)]
    for _ in range(n):
        out.append(lm.decode(int(out[-1].argmax())))
    return np.array(out)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_strength_zero_is_no_steering_to_the_bit(both, engine):
    model = both[engine]
    ids = model.tokenizer.encode("the sun")
    model.lm.steer(None)
    plain = steps(model.lm, ids)
    model.lm.steer(steering(model, 0.0)[0])
    try:
        zero = steps(model.lm, ids)
        model.lm.steer(steering(model, 1.0)[0])
        one = steps(model.lm, ids)
    finally:
        model.lm.steer(None)
    assert np.array_equal(zero, plain)
    assert np.abs(one - plain).max() > 0.1  # strength 1 does change them


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("strength", [0.5, -3.0])
def test_strength_s_adds_s_v_to_the_stream_out_of_its_block(both, engine, strength):
    """The steered logits equal a pass whose block-LAYER output is replaced by the plain
    one + s v (computed here in float64), and the next block reads exactly that stream."""
    model = both[engine]
    ids = model.tokenizer.encode("love the box")
    s, v = steering(model, strength)
    point, after = f"blocks.{LAYER}.resid_out", f"blocks.{LAYER + 1}.resid_in"
    hooked = numpy_hooked if engine == "numpy" else torch_hooked
    target = model.config.model if engine == "numpy" else model.lm.model

    def as_numpy(x):
        return x.double().numpy() if isinstance(x, torch.Tensor) else x.astype(np.float64)
    seen = {}
    with hooked(target, {point: lambda h, p: seen.__setitem__(p, as_numpy(h[0]))}):
        model.lm.full(ids)
    moved = (seen[point] + strength * v.vector.astype(np.float64)).astype(np.float32)

    def replace(h, p):
        return torch.from_numpy(moved[None]) if engine == "torch" else moved[None]
    with hooked(target, {point: replace}):
        expected = model.lm.full(ids)
    model.lm.steer(s)
    try:
        got = model.lm.full(ids)
        with pytest.raises(ValueError, match="hooked already"):  # steering is a hook set
            with hooked(target, {after: lambda h, p: None}):
                model.lm.full(ids)
    finally:
        model.lm.steer(None)
    tol = float32_tolerance(16, model_depth(3), np.abs(expected).max())
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)
    assert np.abs(got - model.lm.full(ids)).max() > 100 * tol  # the steering mattered


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_steered_cached_decoding_equals_steered_recomputation(engine, kind):
    extra = {} if kind == "gpt" else dict(pos_encoding="rope", norm="rmsnorm", ffn="swiglu",
                                         n_kv_head=1, bias=False)
    model = models(**extra)[engine]
    s, _ = steering(model, 2.0)
    model.lm.steer(s)
    ids = model.tokenizer.encode("the sun")
    cached = steps(model.lm, ids, 10)
    tokens = [int(z.argmax()) for z in cached[:-1]]
    full = np.array([model.lm.full(ids + tokens[:i]) for i in range(len(tokens) + 1)])
    tol = float32_tolerance(16, model_depth(3), np.abs(full).max())
    np.testing.assert_allclose(cached, full, rtol=0, atol=tol)
    assert [int(z.argmax()) for z in full[:-1]] == tokens
    model.lm.steer(None)
    assert np.abs(steps(model.lm, ids, 10) - cached).max() > 100 * tol


def test_both_engines_steer_alike(both):
    ids = both["numpy"].tokenizer.encode("a sun")
    out = {}
    for engine, model in both.items():
        model.lm.steer(steering(model, 1.5)[0])
        out[engine] = steps(model.lm, ids, 8)
        model.lm.steer(None)
    tol = float32_tolerance(16, model_depth(3), np.abs(out["torch"]).max())
    np.testing.assert_allclose(out["numpy"], out["torch"], rtol=0, atol=tol)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_the_batched_generator_steers_every_row(both, engine):
    from sheepop.config.schema import SampleConfig
    model = both[engine]
    tok = model.tokenizer
    prompts = [tok.encode(p) for p in ("the sun", "a box of", "love")]
    cfg = SampleConfig(temperature=0.0, max_new_tokens=8)
    model.lm.steer(steering(model, 2.0)[0])
    try:
        alone = [[s.token for s in generate(model.lm, p, cfg)] for p in prompts]
        batch = generate_batch_ids(model.lm, prompts, cfg)
    finally:
        model.lm.steer(None)
    plain = [[s.token for s in generate(model.lm, p, cfg)] for p in prompts]
    assert [list(r) for r in batch] == alone
    assert alone != plain


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_rows_steered_each_their_own_way_equal_each_row_alone(both, engine):
    """steered_rows (the server's batch): row 0 steered +2, row 1 not, row 2 at -1 at another
    layer; each row's logits equal that row run alone with its own steering."""
    model = both[engine]
    lm = model.lm
    v1 = make_vector(model, "tiny", POSITIVE, NEGATIVE, 1)
    v0 = make_vector(model, "tiny", POSITIVE, NEGATIVE, 0)
    rows = [Steering(((v1, 2.0),)), None, Steering(((v0, -1.0),))]
    prompts = [model.tokenizer.encode(p) for p in ("the sun", "a box", "love is")]
    with lm.steered_rows(rows):
        first = lm.prefill_batch(prompts)
        second = lm.decode_batch([int(z.argmax()) for z in first])
    assert lm.additions == {}
    for b, (p, s) in enumerate(zip(prompts, rows)):
        lm.steer(s)
        alone = [lm.prefill(p)]
        alone.append(lm.decode(int(first[b].argmax())))
        lm.steer(None)
        tol = float32_tolerance(16, model_depth(3), np.abs(alone[0]).max())
        np.testing.assert_allclose(first[b], alone[0], rtol=0, atol=tol)
        np.testing.assert_allclose(second[b], alone[1], rtol=0, atol=tol)


def test_the_file_keeps_the_vector_and_refuses_another_width(tmp_path, both):
    v = make_vector(both["numpy"], "tiny", POSITIVE, NEGATIVE, 2, "last")
    v.save(tmp_path / "v.safetensors")
    back = read_vector(tmp_path / "v.safetensors")
    assert np.array_equal(back.vector, v.vector)
    assert (back.layer, back.point, back.model, back.n_layer, back.positions) == \
        (2, "blocks.2.resid_out", "tiny", 3, "last")
    assert back.width == 16
    back.check_fits(both["numpy"].config.model, "tiny", "v")  # fits its own model
    wide = model_config(n_embd=32)
    with pytest.raises(UserError, match=r"v: a steering vector of width 16 \(made on model "
                                        r"'tiny'\) cannot steer model 'wide' of width 32"):
        back.check_fits(wide, "wide", "v")
    with pytest.raises(UserError, match="at layer 2 .* of 2 layers"):
        back.check_fits(model_config(n_layer=2), "short", "v")
    (tmp_path / "w.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}      ")
    with pytest.raises(UserError, match="not a sheepop steering vector"):
        read_vector(tmp_path / "w.safetensors")


def test_prompt_files(tmp_path):
    (tmp_path / "p.txt").write_text("one\n\ntwo words\n")
    (tmp_path / "p.jsonl").write_text('"one"\n{"text": "two"}\n{"prompt": "three"}\n')
    (tmp_path / "bad.jsonl").write_text('"one"\n{"answer": 1}\n')
    assert read_prompts(tmp_path / "p.txt") == ["one", "two words"]
    assert read_prompts(tmp_path / "p.jsonl") == ["one", "two", "three"]
    with pytest.raises(UserError, match="bad.jsonl, line 2"):
        read_prompts(tmp_path / "bad.jsonl")


def test_a_strength_must_be_finite():
    v = SteeringVector(np.ones(4, np.float32), 0, "m", 1)
    with pytest.raises(ValueError, match="finite"):
        Steering(((v, float("nan")),))
