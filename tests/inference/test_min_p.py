"""min-p (issue 41, section 2) and a temperature so small that z / tau overflows (section 5):
the sampling rule on known numbers, then the same rule in both engines' generation loops."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from variants import ROPE

from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.generate import generate, next_token
from sheepop.generation.sample import probabilities
from sheepop.inference.load import build
from sheepop.scratch.init import param_shapes

P = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
LOGITS = np.log(P)


def test_min_p_keeps_what_its_formula_keeps():
    # m = 0.25: keep p_i >= 0.25 * 0.5 = 0.125, so 0.5, 0.2 and 0.15 (sum 0.85)
    assert probabilities(LOGITS, 1.0, min_p=0.25) == pytest.approx(
        [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], rel=1e-12)
    # after the temperature: tau 0.5 makes p_i proportional to p_i^2 = .25 .04 .0225 .01 .0025;
    # m = 0.1 keeps those >= 0.025: only .25 and .04
    assert probabilities(LOGITS, 0.5, min_p=0.1) == pytest.approx(
        [0.25 / 0.29, 0.04 / 0.29, 0, 0, 0], rel=1e-12)
    # after top-p 0.9 (0.5 + 0.2 + 0.15 = 0.85 < 0.9: 0.1 stays, renormalised by 0.95): the
    # ratio to the largest is unchanged, m = 0.3 keeps p_i >= 0.15
    assert probabilities(LOGITS, 1.0, top_p=0.9, min_p=0.3) == pytest.approx(
        [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], rel=1e-12)
    # the edges: 0 is off, 1 keeps the largest (and its exact ties) only
    assert probabilities(LOGITS, 1.0, min_p=0.0) == pytest.approx(P, rel=1e-12)
    assert probabilities(LOGITS, 1.0, min_p=1.0).tolist() == [1, 0, 0, 0, 0]
    assert probabilities(np.log([0.4, 0.4, 0.2]), 1.0, min_p=1.0) == pytest.approx([0.5, 0.5, 0])


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_min_p_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match=r"min_p must be in \[0, 1\] \(0: off\)"):
        probabilities(LOGITS, 1.0, min_p=bad)
    with pytest.raises(ValueError, match="min_p"):
        next_token(LOGITS, SampleConfig(min_p=bad), np.random.default_rng(0))


@pytest.mark.parametrize("tau", [5e-324, 1e-308, 1e-300])
def test_a_temperature_whose_division_overflows_is_greedy(tau):
    """(z - max z) / tau is at worst -inf: the limit of softmax(z / tau) as tau -> 0, all of p
    on the argmax. Divided unshifted, z / tau was inf - inf = NaN for every token."""
    z = np.array([1.5, -2.0, 3.25, 3.0, -np.inf])  # (-inf: a token never generated)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered" on the way
        assert probabilities(z, tau).tolist() == [0, 0, 1, 0, 0]
        for seed in range(5):
            finite = np.where(np.isfinite(z), z, 9.0)  # (id 4 banned by next_token instead)
            token, q = next_token(finite, SampleConfig(temperature=tau, seed=seed),
                                  np.random.default_rng(seed), never=[4])
            assert token == 2 and q.tolist() == [0, 0, 1, 0, 0]
    # exact ties share the limit (greedy takes the first of them)
    assert probabilities(np.array([2.0, 2.0, 1.0]), tau).tolist() == [0.5, 0.5, 0]


def tiny_model(engine: str):
    """A 2-layer rotary model of width 32 with random weights (logits spread over ~10 nats)."""
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=40, block_size=64, n_layer=2, n_head=2, n_embd=32,
                            tie_weights=False, **ROPE)
    rng = np.random.default_rng(7)
    weights = {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
                   + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
               for k, s in param_shapes(cfg.model).items()}
    return build(cfg, weights, engine=engine, device="cpu")


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_both_engines_draw_from_the_min_p_distribution(engine):
    """Each step's distribution (`show_probs`) is min-p's formula on that engine's own logits:
    softmax(z / tau), then keep q_i >= m max q, renormalise."""
    model = tiny_model(engine)
    prompt, tau, m = [3, 5, 7, 2], 1.3, 0.2
    cfg = SampleConfig(max_new_tokens=6, temperature=tau, top_k=0, top_p=1.0, min_p=m, seed=4)
    V = model.config.model.vocab_size
    steps = list(generate(model.lm, prompt, cfg, use_cache=False, show_probs=V))
    ids = list(prompt)
    for step in steps:
        z = model.lm.full(ids).astype(np.float64)
        q = np.exp((z - z.max()) / tau)
        q /= q.sum()
        q = np.where(q >= m * q.max(), q, 0.0)
        q /= q.sum()
        shown = np.zeros(V)
        for token, p in step.top:
            shown[token] = p
        assert 1 < (q > 0).sum() < V  # min-p cut some tokens and kept more than one
        np.testing.assert_allclose(shown, q, rtol=1e-12, atol=0)
        assert q[step.token] > 0
        ids.append(step.token)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_python_api_at_a_tiny_temperature_is_greedy(engine):
    model = tiny_model(engine)
    greedy = [s.token for s in generate(model.lm, [3, 5], SampleConfig(max_new_tokens=12,
                                                                       temperature=0.0))]
    tiny = [s.token for s in generate(model.lm, [3, 5], SampleConfig(max_new_tokens=12,
                                                                     temperature=5e-324))]
    assert tiny == greedy
