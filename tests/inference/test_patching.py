"""Activation patching, attribution patching and direct logit attribution
(sheepop.inference.patching, .attribution, .logit_attribution; docs/experiments.md) on small
models in both engines, against independent computations: a point patched with its own value
changes no bit, the last block's output at the last position is the clean pass (score 1 to the
last bit), the two engines give the same grids within float32's bound, attribution patching is
the derivative finite differences of the metric measure (float64), and the shares of a logit
sum to it within float32's bound."""

import numpy as np
import pytest
from float_tolerance import float32_tolerance, model_depth
from variants import gqa, llama

from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.inference.attribution import attribution_grid
from sheepop.inference.hooked_engines import NoGradients, NumpyHooked, TorchHooked, hooked_engine
from sheepop.inference.load import build
from sheepop.inference.logit_attribution import logit_shares
from sheepop.inference.patching import contrast, index_of, patch_grid, point_of
from sheepop.model import GPT
from sheepop.scratch.gpt import GRADIENT_POINTS, gpt_backward, gpt_forward
from sheepop.scratch.hooks import hooked
from sheepop.scratch.init import param_shapes

KINDS = {"gpt": dict(pos_encoding="sinusoidal"),
         "llama": llama(rope_theta=100.0, **gqa(4, 2))}
CLEAN, CORRUPTED = [3, 1, 4, 1, 5, 9, 2], [3, 1, 7, 1, 5, 9, 2]
ANSWER, WRONG = 6, 8


def config(kind: str) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=11, block_size=16, n_layer=3, n_head=2, n_embd=16),
                          **KINDS[kind]})


def weights(cfg: ModelConfig, dtype=np.float32, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
                + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(dtype)
            for k, s in param_shapes(cfg).items()}


def engines(cfg: ModelConfig, w: dict) -> dict:
    model = GPT(cfg).eval()
    model.load_numpy_weights(w)
    if w["tok_emb.weight"].dtype == np.float64:
        model.double()
    return {"numpy": NumpyHooked(w, cfg), "torch": TorchHooked(model)}


def the_contrast(cfg: ModelConfig):
    return contrast(CLEAN, CORRUPTED, ANSWER, WRONG, cfg.vocab_size)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("grid", ["positions", "heads"])
def test_a_point_patched_with_its_own_value_changes_no_bit(kind, engine, grid):
    cfg = config(kind)
    e = engines(cfg, weights(cfg))[engine]
    layer, column = 1, 1  # (head 1 of 2; position 1 of 7)
    point = point_of(grid, layer)
    plain, own = e.values(CORRUPTED, [point])
    where = index_of(grid, column, None)

    def moved(a):
        a[where] = own[point][where]

    patched = e.last_logits(CORRUPTED, {point: lambda v, name: e.edited(v, moved)})
    assert np.array_equal(patched, plain)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_the_last_block_at_the_last_position_is_the_clean_run(kind, engine):
    cfg = config(kind)
    e = engines(cfg, weights(cfg))[engine]
    grid = patch_grid(e, the_contrast(cfg), "positions")
    T = len(CLEAN)
    assert grid.scores.shape == (cfg.n_layer, T) and grid.scores[-1, -1] == 1.0
    # the last block's other positions reach no logit of the last position: nothing moves
    assert np.array_equal(grid.metric[-1, :-1], np.full(T - 1, grid.corrupted))
    # nor does a position before the changed token (2), in any block (causal attention)
    assert np.array_equal(grid.metric[:, :2], np.full((cfg.n_layer, 2), grid.corrupted))
    assert grid.clean != grid.corrupted and abs(grid.scores[0, 2]) > 0.01


def _score_tolerance(cfg, grids) -> float:
    """Two float32 evaluations of the metric differ by up to twice one logit's bound (a
    difference of two logits), so a score (m - m*) / (m_c - m*) by up to that over |m_c - m*|
    for its numerator and |score| times it for its denominator."""
    g = grids[0]
    logit = float32_tolerance(max(cfg.ffn_dim, cfg.vocab_size), model_depth(cfg.n_layer),
                              max(abs(g.clean), abs(g.corrupted), np.abs(g.metric).max()))
    spread = abs(g.clean - g.corrupted)
    return 2 * 2 * logit * (1 + np.abs(g.scores).max()) / spread


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("grid", ["positions", "heads"])
def test_both_engines_give_the_same_grids(kind, grid):
    cfg = config(kind)
    es = engines(cfg, weights(cfg))
    for make in (patch_grid, attribution_grid):
        mine, theirs = (make(es[e], the_contrast(cfg), grid) for e in ("numpy", "torch"))
        assert mine.scores.shape == (cfg.n_layer, len(CLEAN) if grid == "positions"
                                     else cfg.n_head)
        assert np.abs(mine.scores - theirs.scores).max() <= _score_tolerance(cfg, [mine])
        assert np.abs(mine.scores).max() > 0.05  # (grids that say something)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("grid", ["positions", "heads"])
def test_attribution_patching_is_the_metrics_derivative_by_finite_differences(kind, engine,
                                                                              grid):
    """In float64: each cell's estimate m* + (a - a*) . dm/da against m* + (m(a* + eps d) -
    m(a* - eps d)) / (2 eps), d = a - a* on the cell's part of the point. The central
    difference's error is eps^2 |m'''| / 6 plus the metric's rounding over eps: ~1e-10
    and ~1e-11 at eps = 1e-5, so 1e-7 of the metric's size is a thousand times the bound and
    ten thousand times below a wrong gradient's error."""
    cfg = config(kind)
    e = engines(cfg, weights(cfg, np.float64))[engine]
    c = the_contrast(cfg)
    estimate = attribution_grid(e, c, grid)
    points = [point_of(grid, layer) for layer in range(cfg.n_layer)]
    _, clean = e.values(c.clean, points)
    _, corrupted = e.values(c.corrupted, points)
    eps = 1e-5
    for r, point in enumerate(points):
        for j, column in enumerate(estimate.columns):
            where = index_of(grid, column, None)
            step = clean[point][where] - corrupted[point][where]

            def metric_at(sign, where=where, step=step, point=point):
                def moved(a):
                    a[where] += sign * eps * step
                z = e.last_logits(c.corrupted, {point: lambda v, n: e.edited(v, moved)})
                return c.metric(z)

            slope = (metric_at(1) - metric_at(-1)) / (2 * eps)
            scale = max(1.0, abs(estimate.corrupted))
            assert abs(estimate.metric[r, j] - (estimate.corrupted + slope)) <= 1e-7 * scale
    assert np.abs(estimate.metric - estimate.corrupted).max() > 0.01


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_the_direct_attributions_sum_to_the_logit(kind, engine):
    """The shares, in float64 from the pass's float32 values, against the engine's float32
    logit: the residual stream they split is the pass's float32 sum of the same parts, so they
    differ by the pass's rounding: one logit's bound."""
    cfg = config(kind)
    w = weights(cfg)
    e = engines(cfg, w)[engine]
    shares = logit_shares(e, CLEAN, ANSWER)
    n_parts = (1 + cfg.n_layer * (cfg.n_head + 1 + cfg.bias) + (cfg.norm == "layernorm")
               + cfg.head_bias)  # embed, heads, b_proj, ffn; beta, b_head
    assert len(shares.names) == n_parts == len(shares.shares)
    magnitude = np.abs(shares.shares).sum()
    tolerance = float32_tolerance(max(cfg.ffn_dim, cfg.vocab_size), model_depth(cfg.n_layer),
                                  magnitude)
    assert abs(shares.shares.sum() - shares.logit) <= tolerance
    assert tolerance < 1e-3 * magnitude  # (a bound that could fail)


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "int4"])
def test_the_torch_engines_other_weight_types_patch_and_int8_int4_refuse_the_estimate(dtype):
    """bfloat16 points go through NumPy as float32 (exactly) and back; int8 and int4 have no
    backward in torch, so the estimate is refused by name while the exact grid runs."""
    cfg = ModelConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32,
                      **llama(rope_theta=100.0))  # (int4's kernel: inputs in 32s)
    config_ = Config()
    config_.model = cfg
    e = hooked_engine(build(config_, weights(cfg), engine="torch", device="cpu", dtype=dtype))
    grid = patch_grid(e, the_contrast(cfg), "positions")
    assert grid.scores[-1, -1] == 1.0 and np.isfinite(grid.scores).all()
    if dtype == "bfloat16":
        assert np.isfinite(attribution_grid(e, the_contrast(cfg), "heads").scores).all()
    else:
        with pytest.raises(NoGradients, match="int8 and int4 kernels have none"):
            attribution_grid(e, the_contrast(cfg), "heads")


def test_a_contrast_of_unequal_lengths_or_one_answer_is_refused_by_name():
    with pytest.raises(UserError, match="the clean prompt has 3 tokens and the corrupted one 4"):
        contrast([1, 2, 3], [1, 2, 3, 4], 1, 2, 11)
    with pytest.raises(UserError, match="the answer and the wrong token are the same"):
        contrast([1, 2, 3], [1, 2, 4], 5, 5, 11)
    with pytest.raises(UserError, match="the wrong token 11 is outside the vocabulary"):
        contrast([1, 2, 3], [1, 2, 4], 5, 11, 11)


def test_the_numpy_backward_refuses_a_pass_whose_point_was_replaced():
    cfg = config("gpt")
    w = weights(cfg)
    idx = np.asarray([CLEAN])
    with hooked(cfg, {"blocks.1.resid_out": lambda h, p: h * 2}):
        logits, _, cache = gpt_forward(w, cfg, idx)
    with pytest.raises(ValueError, match="a hook replaced a point"):
        gpt_backward(cache, dlogits=np.ones_like(logits))
    with hooked(cfg, {"blocks.1.resid_out": lambda h, p: None}):  # observing is fine
        logits, _, cache = gpt_forward(w, cfg, idx)
    with pytest.raises(ValueError, match="no gradient at 'blocks.0.attn.pattern'"):
        gpt_backward(cache, dlogits=np.ones_like(logits),
                     gradients={"blocks.0.attn.pattern": lambda g, p: None})
    seen = {}
    gpt_backward(cache, dlogits=np.ones_like(logits),
                 gradients={"embed": lambda g, p: seen.update({p: g.shape})})
    assert seen == {"embed": (1, len(CLEAN), cfg.n_embd)}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_gradient_point_of_the_numpy_backward_is_the_derivative(kind):
    """Each point gpt_backward reads a gradient at (embed and GRADIENT_POINTS) in float64:
    <d, dm/da> against the central difference of m along a random direction d."""
    cfg = config(kind)
    w = weights(cfg, np.float64)
    e = NumpyHooked(w, cfg)
    points = ["embed"] + [f"blocks.1.{p}" for p in GRADIENT_POINTS]
    _, values, grads = e.gradients(CORRUPTED, points, {ANSWER: 1.0, WRONG: -1.0})
    rng = np.random.default_rng(0)
    for point in points:
        d = rng.normal(size=values[point].shape)

        def m(sign, d=d, point=point):
            z = e.last_logits(CORRUPTED, {point: lambda v, n: v + sign * 1e-5 * d})
            return z[ANSWER] - z[WRONG]

        slope = (m(1) - m(-1)) / 2e-5
        assert abs(slope - np.sum(d * grads[point])) <= 1e-7 * max(1.0, abs(slope)), point
        assert abs(slope) > 1e-3, point
