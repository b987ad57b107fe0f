"""Digit places (model.digit_positions): the places computed from token ids in both engines,
the table's hand-written backward against finite differences (float64) and torch autograd,
the KV cache and left padding giving the places of a whole, unpadded forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scratch_gradcheck import check

from sheepop.arch.batch import left_pad
from sheepop.config.model_size import param_count
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.model import GPT as TorchGPT
from sheepop.model.positions import digit_places as torch_digit_places
from sheepop.model.positions import term_index as torch_term_index
from sheepop.positional import digit_places, place_rows, term_index
from sheepop.scratch.gpt import gpt_backward, gpt_forward, new_cache
from sheepop.scratch.init import init_params, param_shapes

SPACE = 10
# "12 345 6" then a run carried from a previous call, and a row of spaces and a special id.
IDS = np.array([[1, 2, SPACE, 3, 4, 5, SPACE, 6],
                [SPACE, 0, 0, 0, SPACE, SPACE, 11, 2]])
PLACES = [[1, 2, 0, 1, 2, 3, 0, 1],
          [0, 1, 2, 3, 0, 0, 0, 1]]
TERMS = [[0, 0, 1, 1, 1, 1, 2, 2],  # a separator opens the number after it
         [0, 0, 0, 0, 1, 1, 1, 1]]


def config(**kw) -> ModelConfig:
    base = dict(vocab_size=12, block_size=8, n_layer=2, n_head=2, n_embd=8, d_ff=12,
                digit_positions=6)
    base.update(kw)
    return ModelConfig(**base)


def perturbed(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = init_params(cfg, seed, np.float64)
    for v in params.values():
        v += rng.standard_normal(v.shape) * (0.3 if v.ndim > 1 else 0.2)
    return params


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_places_exact_in_both_engines():
    np.testing.assert_array_equal(digit_places(IDS), PLACES)
    np.testing.assert_array_equal(torch_digit_places(torch.from_numpy(IDS)).numpy(), PLACES)
    before = np.array([3, 0])  # row 0 continues a run of 3 digits, row 1 a fresh one
    expected = [[4, 5, 0, 1, 2, 3, 0, 1], PLACES[1]]
    np.testing.assert_array_equal(digit_places(IDS, before), expected)
    np.testing.assert_array_equal(
        torch_digit_places(torch.from_numpy(IDS), torch.from_numpy(before)).numpy(), expected)
    real = np.ones_like(IDS, dtype=bool)
    real[:, :2] = False  # padding is no digit, whatever its id
    np.testing.assert_array_equal(digit_places(IDS, None, real)[1], [0, 0, 1, 2, 0, 0, 0, 1])
    np.testing.assert_array_equal(term_index(IDS), TERMS)
    np.testing.assert_array_equal(torch_term_index(torch.from_numpy(IDS)).numpy(), TERMS)
    state = np.array([[3, 4], [0, 2]])  # (run of digits, numbers ended) before this call
    expected_terms = [[4, 4, 5, 5, 5, 5, 6, 6], [2, 2, 2, 2, 3, 3, 3, 3]]
    np.testing.assert_array_equal(term_index(IDS, state), expected_terms)
    np.testing.assert_array_equal(
        torch_term_index(torch.from_numpy(IDS), torch.from_numpy(state)).numpy(),
        expected_terms)
    # rows: place + offset (non-digits too: the separator stays one row below a first digit),
    # clipped to the table
    np.testing.assert_array_equal(place_rows(np.array([0, 1, 2, 5]), 2, 6), [2, 3, 4, 5])


@pytest.mark.parametrize("kw", [{}, {"pos_encoding": "rope", "tie_weights": False},
                                {"pos_encoding": "learned", "digit_offset": 3},
                                {"pos_encoding": "none", "term_positions": 3, "digit_offset": 2},
                                {"pos_encoding": "none", "digit_positions": 0,
                                 "term_positions": 4},
                                {"pos_encoding": "rope_terms", "digit_offset": 2},
                                {"pos_encoding": "rope_places", "digit_offset": 2}])
def test_gradients_match_finite_differences(kw):
    cfg = config(**kw)
    params = perturbed(cfg)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, cfg.vocab_size, (3, 8))
    targets = rng.integers(0, cfg.vocab_size, (3, 8))
    targets[0, 5:] = -1
    # With an offset, a training forward (an rng given) draws one per row: the same draw for
    # every finite-difference forward.
    gen = (lambda: np.random.default_rng(7)) if cfg.digit_offset else (lambda: None)
    _, _, cache = gpt_forward(params, cfg, idx, targets, gen())
    grads = gpt_backward(cache)
    tables = [n for n in ("digit_emb.weight", "digit_emb.terms") if n in param_shapes(cfg)]
    assert set(grads) == set(param_shapes(cfg)) and tables
    assert all(np.abs(grads[n]).sum() > 0 for n in tables)
    check(lambda: gpt_forward(params, cfg, idx, targets, gen())[1],
          {n: params[n] for n in tables}, grads, None)
    check(lambda: gpt_forward(params, cfg, idx, targets, gen())[1],
          {k: v for k, v in params.items() if k not in tables}, grads, None, max_entries=6)


@pytest.mark.parametrize("kw", [{}, {"pos_encoding": "rope"},
                                {"pos_encoding": "none", "term_positions": 3},
                                {"pos_encoding": "rope_terms"},
                                {"pos_encoding": "rope_places", "digit_positions": 0}])
def test_gradients_match_torch_autograd(kw):
    cfg = config(**kw)
    params = perturbed(cfg)
    rng = np.random.default_rng(2)
    x = rng.integers(0, cfg.vocab_size, (3, 8))
    y = rng.integers(0, cfg.vocab_size, (3, 8))
    logits, loss, cache = gpt_forward(params, cfg, x, y)
    grads = gpt_backward(cache)
    model = TorchGPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    t_logits, t_loss = model(torch.from_numpy(x), torch.from_numpy(y))
    t_loss.backward()
    # 1e-6: torch keeps the sinusoidal table in float32 (test_scratch_vs_torch's tolerance)
    assert rel(logits, t_logits.detach().numpy()) <= 1e-6
    t_grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    assert set(t_grads) == set(grads)
    errors = {n: rel(g, t_grads[n]) for n, g in grads.items()}
    assert max(errors.values()) <= 1e-6, errors
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())


def test_training_offsets_move_every_digit_of_a_row_alike():
    cfg = config(digit_offset=3)
    rows = [place_rows(digit_places(IDS), off, cfg.digit_positions) for off in range(4)]
    gen = np.random.default_rng(0)
    from sheepop.scratch.positions import digit_rows
    drawn = digit_rows(IDS, cfg, slice(0, 8), rng=gen)[0]["digit_emb.weight"]
    for b in range(2):
        assert any((drawn[b] == r[b]).all() for r in rows)
    np.testing.assert_array_equal(digit_rows(IDS, cfg, slice(0, 8))[0]["digit_emb.weight"],
                                  rows[0])  # inference


@pytest.mark.parametrize("engine", ["numpy", "torch"])
@pytest.mark.parametrize("kind", ["rope", "rope_terms", "rope_places"])
def test_cache_and_padding_give_the_places_of_one_forward(engine, kind):
    cfg = config(pos_encoding=kind, term_positions=4)
    params = perturbed(cfg)
    prompts = [[1, 2, SPACE, 3, 4], [5, 6, 7]]  # the second is left-padded with id 0, a digit
    idx, pos, real = left_pad(prompts)
    steps = np.array([[8, 9], [SPACE, 2]])  # row b's next two tokens
    if engine == "numpy":
        def run(x, cache=None, **kw):
            return gpt_forward(params, cfg, x, cache=cache, **kw)[0]
        cache = new_cache(cfg, 2, 8, np.float64)
    else:
        model = TorchGPT(cfg).double().eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(params[name]))

        def run(x, cache=None, pos_ids=None, key_mask=None):
            with torch.no_grad():
                mask = None
                if key_mask is not None:
                    from sheepop.arch.batch import allowed_keys
                    past = cache.length if cache is not None else 0
                    mask = torch.from_numpy(allowed_keys(x.shape[1], past, key_mask))
                pid = None if pos_ids is None else torch.from_numpy(pos_ids)
                return model(torch.from_numpy(x), cache=cache, pos_ids=pid,
                             attn_mask=mask)[0].numpy()
        cache = model.new_cache(2, 8)
    out = [run(idx, cache, pos_ids=pos, key_mask=real)[:, -1]]
    key_mask = np.concatenate([real, np.ones((2, 3), bool)], axis=1)
    for t in range(steps.shape[1]):
        step = steps[:, t:t + 1]
        out.append(run(step, cache, pos_ids=pos[:, -1:] + 1 + t,
                       key_mask=key_mask[:, :idx.shape[1] + t + 1])[:, -1])
    for b, prompt in enumerate(prompts):  # each row alone, whole, no cache
        alone = np.array([prompt + steps[b].tolist()])
        full = run(alone)[0]
        n = len(prompt)
        np.testing.assert_allclose(np.stack(out)[:, b], full[n - 1:], rtol=1e-9, atol=1e-12)


def test_config_rules():
    cfg = Config()
    cfg.model.digit_positions = 8
    with pytest.raises(UserError, match="digits tokenizer"):
        cfg.validate()
    cfg.data.tokenizer = "digits"
    cfg.model.digit_offset = 7
    with pytest.raises(UserError, match="digit_offset"):
        cfg.validate()
    cfg.model.digit_offset = 6
    cfg.validate()


def test_rope_places_scores_depend_on_the_offsets_only():
    """rope_places turns half the pairs by the term index n and half by the digit place r, so
    q . k is the same for every (query, key) pair of places with the same offsets, in both
    engines: the rule for "the same digit of the number before" is one rule for every place."""
    from sheepop.model.positions import PlaceRotaryPositions
    from sheepop.scratch.rope import rope_angles, rope_cache, rope_forward
    cfg = config(pos_encoding="rope_places", digit_positions=0, n_head=1)
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 1, 1, 1, cfg.head_dim))  # (B, H, T, d_k) each

    def score(query_at, key_at, engine):
        pos = np.array([[query_at, key_at]])  # (B=1, T=2, 2): (n, r) of each
        if engine == "numpy":
            angles = rope_angles(pos, cfg.head_dim, cfg.rope_theta, np.float64)
            turned = [rope_forward(x, rope_cache(angles.cos[:, :, i:i + 1],
                                                 angles.sin[:, :, i:i + 1]))
                      for i, x in enumerate((q, k))]
        else:
            rot = PlaceRotaryPositions(cfg)
            # the query and the key stacked on the head axis, each at both positions
            qk = torch.from_numpy(np.concatenate((q, k), axis=1)).repeat(1, 1, 2, 1)
            turned_qk = rot.rotate(qk, torch.from_numpy(pos)).numpy()
            turned = [turned_qk[:, :1, :1], turned_qk[:, 1:, 1:]]
        return float((turned[0] * turned[1]).sum())

    for engine in ("numpy", "torch"):
        base = score((2, 1), (1, 2), engine)  # the next place of the number before
        for shift_n, shift_r in [(0, 3), (5, 0), (1, 6)]:
            moved = score((2 + shift_n, 1 + shift_r), (1 + shift_n, 2 + shift_r), engine)
            assert moved == pytest.approx(base, rel=1e-12, abs=1e-12)
        assert score((2, 1), (1, 1), engine) != pytest.approx(base, rel=1e-3)
        assert score((2, 1), (0, 2), engine) != pytest.approx(base, rel=1e-3)


def test_the_numpy_trainer_draws_offsets_without_dropout():
    """The places of 3-digit terms read rows 0-3 at inference; a training step of the NumPy
    engine (dropout 0) moves them by 0..digit_offset, so rows past 3 get gradients too."""
    from sheepop.config.schema import TrainConfig
    from sheepop.train.engine_numpy import NumpyEngine
    cfg = config(pos_encoding="rope_terms", digit_positions=8, digit_offset=4, dropout=0.0,
                 vocab_size=11)
    engine = NumpyEngine(cfg, TrainConfig(lr=1e-3, seed=0))
    x = np.tile([1, 2, 3, SPACE, 4, 5, 6, SPACE], (16, 1))
    y = np.roll(x, -1, axis=1)
    engine.train_step([(x, y)], 1e-3)
    used = np.abs(engine.model.grads["digit_emb.weight"]).sum(axis=1) > 0
    assert used[:4].all() and used[4:].any()
