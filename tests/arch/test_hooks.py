"""The named hook points (sheepop.arch.hooks) in both engines (sheepop.model.hooks,
sheepop.scratch.hooks): every point reads the same value in the torch and the NumPy engine,
replacing a point with its own value changes no bit of the logits, replacing a head's output by
zeros is the model without that head, a decode step's points are the full pass's last row, and
no hook outlives its pass."""

import numpy as np
import pytest
import torch
from float_tolerance import float32_tolerance, model_depth
from variants import gqa, llama

from sheepop.arch.hooks import EXPLICIT_POINTS, point_names
from sheepop.config.schema import ModelConfig
from sheepop.model import GPT
from sheepop.model.hooks import hooked as torch_hooked
from sheepop.scratch.gpt import gpt_forward, new_cache
from sheepop.scratch.hooks import active
from sheepop.scratch.hooks import hooked as numpy_hooked
from sheepop.scratch.init import param_shapes

KINDS = {  # every layer kind and link the points pass through
    "gpt": dict(pos_encoding="sinusoidal"),
    "llama": llama(rope_theta=100.0, **gqa(4, 2)),
    "modern": dict(pos_encoding="learned", activation="relu2", bias=False, logit_softcap=2.0,
                   qk_norm=True),
    "linked": llama(value_embeds=1, unet_skips=True, qk_norm=True, **gqa(4, 1)),
}
IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


def config(kind: str) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=11, block_size=16, n_layer=3, n_head=2, n_embd=16),
                          **KINDS[kind]})


def weights(cfg: ModelConfig, seed: int = 5) -> dict[str, np.ndarray]:
    """Random weights of size ~0.5 (gains near 1): every point well away from zero."""
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
                + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
            for k, s in param_shapes(cfg).items()}


def torch_model(cfg: ModelConfig, w: dict[str, np.ndarray]) -> GPT:
    model = GPT(cfg).eval()
    model.load_numpy_weights(w)
    return model


def run(engine: str, cfg: ModelConfig, w: dict, hooks: dict, ids=IDS, model=None) -> np.ndarray:
    """The logits (T, V) of one pass of `engine` with `hooks`."""
    if engine == "numpy":
        with numpy_hooked(cfg, hooks):
            return gpt_forward(w, cfg, np.asarray([ids]))[0][0]
    model = model or torch_model(cfg, w)
    with torch.no_grad(), torch_hooked(model, hooks):
        return model(torch.tensor([ids]))[0][0].numpy()


def numpy(x) -> np.ndarray:
    """A copy of a point's value as a NumPy array (the engine goes on with its own)."""
    return x.numpy().copy() if isinstance(x, torch.Tensor) else x.copy()


def observed(engine: str, cfg: ModelConfig, w: dict) -> dict[str, np.ndarray]:
    seen = {}
    run(engine, cfg, w, {p: lambda x, point: seen.__setitem__(point, numpy(x))
                         for p in point_names(cfg)})
    return seen


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_point_reads_the_same_in_both_engines(kind):
    cfg = config(kind)
    w = weights(cfg)
    mine, theirs = observed("numpy", cfg, w), observed("torch", cfg, w)
    assert list(mine) == list(theirs) == point_names(cfg)  # every point, in the pass's order
    T, H, Hkv, dk = len(IDS), cfg.n_head, cfg.kv_heads, cfg.head_dim
    shapes = {"attn.q_pre": (1, H, T, dk), "attn.k": (1, Hkv, T, dk), "attn.v": (1, Hkv, T, dk),
              "attn.pattern": (1, H, T, T), "attn.heads": (1, H, T, dk),
              "ffn.hidden": (1, T, cfg.ffn_dim), "logits": (1, T, cfg.vocab_size)}
    n = max(cfg.n_embd, cfg.ffn_dim, cfg.vocab_size)
    for point, value in mine.items():
        assert value.shape == theirs[point].shape, point
        short = point.split(".", 2)[-1] if point.startswith("blocks.") else point
        if short in shapes:
            assert value.shape == shapes[short], point
        tolerance = float32_tolerance(n, model_depth(cfg.n_layer), np.abs(value).max())
        np.testing.assert_allclose(value, theirs[point], rtol=0, atol=tolerance, err_msg=point)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("kind", ["llama", "linked", "modern"])
def test_replacing_a_point_with_its_own_value_changes_no_bit(kind, engine):
    cfg = config(kind)
    w = weights(cfg)
    model = torch_model(cfg, w) if engine == "torch" else None
    plain = run(engine, cfg, w, {}, model=model)
    if model is not None:  # (a hook at the scores or the pattern takes the explicit path)
        model.set_attention_path(sdpa=False)
    explicit = run(engine, cfg, w, {}, model=model)
    if model is not None:
        model.set_attention_path(sdpa=True)
    copy = lambda x, point: x.clone() if isinstance(x, torch.Tensor) else x.copy()  # noqa: E731
    for point in point_names(cfg):
        logits = run(engine, cfg, w, {point: copy}, model=model)
        reference = explicit if point.endswith(EXPLICIT_POINTS) else plain
        np.testing.assert_array_equal(logits, reference, err_msg=point)


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("kind", ["gpt", "linked"])
def test_zeroing_a_heads_output_is_the_model_without_that_head(kind, engine):
    cfg = config(kind)
    w = weights(cfg)
    layer, head, dk = 1, 1, cfg.head_dim

    def silence(y, point):
        y = y.clone() if isinstance(y, torch.Tensor) else y.copy()
        y[:, head] = 0
        return y

    hooked = run(engine, cfg, w, {f"blocks.{layer}.attn.heads": silence})
    # by hand: the head's d_k columns of W_proj read nothing, a = sum over the other heads
    without = dict(w)
    proj = w[f"blocks.{layer}.attn.proj.weight"].copy()
    proj[:, head * dk:(head + 1) * dk] = 0
    without[f"blocks.{layer}.attn.proj.weight"] = proj
    expected = run(engine, cfg, without, {})
    plain = run(engine, cfg, w, {})
    tolerance = float32_tolerance(cfg.n_embd, model_depth(cfg.n_layer), np.abs(expected).max())
    np.testing.assert_allclose(hooked, expected, rtol=0, atol=tolerance)
    assert np.abs(hooked - plain).max() > 100 * tolerance  # the head mattered


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_a_decode_steps_points_are_the_full_passs_last_row(engine):
    """Through a KV cache one query sees every key (grouped queries: one product per key/value
    head in both engines); its scores and pattern come as (1, H, 1, T_k), the keys the new
    position's."""
    cfg = config("llama")
    w = weights(cfg)
    points = [f"blocks.1.attn.{p}" for p in ("scores", "pattern", "heads", "k")] + ["logits"]
    full, step = {}, {}
    keep = lambda into: lambda x, point: into.__setitem__(point, numpy(x))  # noqa: E731
    run(engine, cfg, w, {p: keep(full) for p in points})
    if engine == "numpy":
        cache = new_cache(cfg, 1, len(IDS))
        gpt_forward(w, cfg, np.asarray([IDS[:-1]]), cache=cache)
        with numpy_hooked(cfg, {p: keep(step) for p in points}):
            gpt_forward(w, cfg, np.asarray([IDS[-1:]]), cache=cache)
    else:
        model = torch_model(cfg, w)
        cache = model.new_cache(1, len(IDS))
        with torch.no_grad():
            model(torch.tensor([IDS[:-1]]), cache=cache)
            with torch_hooked(model, {p: keep(step) for p in points}):
                model(torch.tensor([IDS[-1:]]), cache=cache)
    for point in points:
        tolerance = float32_tolerance(cfg.vocab_size, model_depth(cfg.n_layer),
                                      np.abs(full[point]).max())
        np.testing.assert_allclose(step[point], full[point][..., -1:, :], rtol=0,
                                   atol=tolerance, err_msg=point)


def test_no_hook_outlives_its_pass():
    cfg = config("llama")
    w = weights(cfg)
    calls = []
    count = lambda x, point: calls.append(point)  # noqa: E731
    model = torch_model(cfg, w)
    for engine in ("numpy", "torch"):
        run(engine, cfg, w, {"blocks.0.attn.q": count, "logits": count}, model=model)
        assert len(calls) == 2
        run(engine, cfg, w, {}, model=model)
        with pytest.raises(RuntimeError, match="inside"):
            run(engine, cfg, w, {"embed": lambda x, p: (_ for _ in ()).throw(
                RuntimeError("inside"))}, model=model)
        plain = run(engine, cfg, w, {}, model=model)
        calls.clear()
    assert active() is None
    assert model.hooks is None and all(
        m.hooks is None for b in model.blocks for m in (b, b.attn, b.ffn))
    np.testing.assert_array_equal(plain, run("torch", cfg, w, {}))


def test_a_wrong_point_or_shape_or_a_second_set_is_refused():
    cfg = config("gpt")
    w = weights(cfg)
    model = torch_model(cfg, w)
    with numpy_hooked(cfg, {}), pytest.raises(ValueError, match="one set of hooks"):
        run("numpy", cfg, w, {})
    with torch_hooked(model, {}), pytest.raises(ValueError, match="one set of hooks"):
        run("torch", cfg, w, {}, model=model)
    for engine in ("numpy", "torch"):
        with pytest.raises(ValueError, match="no hook point 'blocks.3.resid_in'"):
            run(engine, cfg, w, {"blocks.3.resid_in": lambda x, p: None})
        with pytest.raises(ValueError, match="blocks.0.ln1 returned shape"):
            run(engine, cfg, w, {"blocks.0.ln1": lambda x, p: x[:, :1]})
