"""Steering SmolLM2-135M (issue 46; docs/steering.md's worked example): a vector made from two
small prompt sets (about love and weddings against plain sentences) at block 15 changes the
greedy continuation at strength 2, towards its topic, and at strength 0 changes no token; both
engines make the same vector within float32's bound."""

from pathlib import Path

import numpy as np
import pytest
from float_tolerance import float32_tolerance, model_depth

from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate
from sheepop.generation.steering import Steering
from sheepop.inference.load import load
from sheepop.inference.steer import make_vector, read_prompts

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("one_torch_thread")]
PROMPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "steering"
LOVE = ("love", "married", "marry", "wedding", "bride", "husband", "wife", "heart", "romantic",
        "together", "blessed", "beauty")


def continuation(model, prompt: str, steering) -> str:
    model.lm.steer(steering)
    cfg = SampleConfig(temperature=0.0, max_new_tokens=24)
    tok = model.tokenizer
    return tok.decode([s.token for s in generate(model.lm, tok.encode(prompt), cfg)])


def test_a_vector_from_two_prompt_sets_steers_smollm2(smollm2_run):
    positive, negative = read_prompts(PROMPTS / "love.txt"), read_prompts(PROMPTS / "neutral.txt")
    models = {e: load(smollm2_run, engine=e, device="cpu") for e in ("numpy", "torch")}
    vectors = {e: make_vector(m, "smollm2", positive[:4], negative[:4], 15)
               for e, m in models.items()}
    v = vectors["numpy"]
    tol = float32_tolerance(576, model_depth(30), 200.0)  # |h| ~ 150-200 at block 15
    np.testing.assert_allclose(v.vector, vectors["torch"].vector, rtol=0, atol=tol)
    model = models["numpy"]
    prompt = "My plans for this weekend are"
    plain = continuation(model, prompt, None)
    assert continuation(model, prompt, Steering(((v, 0.0),))) == plain
    steered = continuation(model, prompt, Steering(((v, 2.0),)))
    assert steered != plain
    words = lambda text: sum(text.lower().count(w) for w in LOVE)  # noqa: E731
    assert words(steered) > words(plain)
