"""Speculative decoding by prompt lookup (sheepop.generation.speculative): the proposal, the
cache's check and rollback in both engines, greedy output equal to plain decoding, and
sampling's distribution equal to plain sampling's, against the exact joint by enumeration."""

import itertools
import math

import numpy as np
import pytest

from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation import speculative
from sheepop.generation.generate import generate
from sheepop.generation.sample import filtered_logits, probabilities
from sheepop.generation.speculative import Gate, propose
from sheepop.inference.load import build
from sheepop.scratch.init import param_shapes


def make_lm(engine: str, vocab: int = 23, block: int = 64, pos: str = "rope", seed: int = 3,
            scale: float = 1.0):
    """A tiny model with random weights (far from uniform attention; matrices' entries of
    standard deviation `scale`: smaller, softer next-token distributions)."""
    cfg = ModelConfig(vocab_size=vocab, block_size=block, n_layer=2, n_head=2, n_embd=16,
                      pos_encoding=pos, dropout=0.0)
    rng = np.random.default_rng(seed)
    weights = {name: (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                      else scale * rng.standard_normal(shape)).astype(np.float32)
               for name, shape in param_shapes(cfg).items()}
    config = Config()
    config.model = cfg
    return build(config, weights, engine=engine).lm


class Counted:
    """Counts the checking passes of a model and the tokens they took."""

    def __init__(self, lm):
        self.lm, self.passes, self.checked, self.sizes, self.decodes = lm, 0, 0, [], 0

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def verify(self, ids):
        self.passes += 1
        self.checked += len(ids)
        self.sizes.append(len(ids))
        return self.lm.verify(ids)

    def decode(self, token):
        self.decodes += 1
        return self.lm.decode(token)


def test_the_proposal_follows_the_latest_occurrence_of_the_longest_ngram():
    #        0  1  2  3  4  5  6  7  8  9 10 11
    ids = [7, 1, 2, 3, 9, 1, 2, 4, 5, 8, 1, 2]
    # (1, 2) ends the text; its latest earlier occurrence is at 5-6, followed by 4, 5, 8
    assert propose(ids, 3) == [4, 5, 8]
    assert propose(ids, 10) == [4, 5, 8, 1, 2]  # as far as the text goes
    # (3, 1, 2) occurs before, so do later (1, 2)s: the 3-gram is tried first, then 2
    assert propose([3, 1, 2, 6, 0, 1, 2, 5, 3, 1, 2], 2) == [6, 0]
    assert propose([3, 1, 2, 6, 0, 9, 1, 2], 2) == [6, 0]
    assert propose([5, 6, 7], 4) == []  # nothing recurs
    assert propose([5, 6, 7, 1, 7], 4) == []  # a single token is not looked up ...
    assert propose([5, 6, 7, 1, 7], 4, ngram_min=1) == [1, 7]  # ... unless asked
    assert propose(ids, 0) == []


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_verify_gives_decodes_logits_and_rollback_forgets(engine):
    lm = make_lm(engine)
    prompt = [1, 5, 9, 2, 7]
    lm.prefill(prompt)
    rows = lm.verify([4, 8, 3])
    plain = make_lm(engine)
    plain.prefill(prompt)
    expected = [plain.decode(t) for t in (4, 8, 3)]
    # float32 logits of order 10 from sums over 16-32 terms: a wider product rounds differently
    # by a few ulps (1e-6 relative); 1e-4 leaves two orders of margin
    np.testing.assert_allclose(rows, np.stack(expected), atol=1e-4)
    lm.rollback(2)  # 8 and 3 rejected: the cache holds prompt + [4]
    after = lm.verify([6])[0]
    fresh = make_lm(engine)
    np.testing.assert_allclose(after, fresh.prefill(prompt + [4, 6]), atol=1e-4)
    assert lm.cache_length == len(prompt) + 2


def test_the_gate_stops_after_a_fruitless_pass_and_resumes_where_the_text_copies():
    """Counts only, no clock: the first pass proposes all 16; one whose first proposal is
    turned down closes the gate. Closed, it proposes nothing but follows the proposal it
    would have made through the tokens that come: 20 tokens off theirs keep it closed; a copy
    that goes on opens it part way through (the next pass proposes all 16 from there)."""
    gate = Gate()
    assert gate.proposals(16) == 16  # nothing known yet: a copy from the start taken whole
    gate.record(16, 0, True)
    gate.took([5])
    assert not gate.open() and gate.proposals(16) == 0
    for _ in range(20):  # plain decode steps, each token off the watched proposal
        assert gate.watching()
        gate.watch([1, 2, 3])
        gate.took([9])
        assert gate.proposals(16) == 0
    copy = list(range(100, 116))
    gate.watch(copy)
    followed = 0
    while not gate.open():
        assert not gate.watching()  # following it
        gate.took([copy[followed]])
        followed += 1
    assert 3 < followed < 16 and gate.proposals(16) == 16 and not gate.watching()
    assert (gate.passes, gate.proposed, gate.accepted) == (1, 16, 0)  # watching is no check
    gate.record(16, 16, False)
    assert gate.open()


def test_the_gate_weighs_a_passs_cost_against_the_tokens_it_expects():
    """V(k) = (1 + G(k)) / c(k + 1): with p = q = 0.9 (copies) all 16 pay; with p = 0.25 and
    q = 0.5 (the quoting summary's 12%) no k does; the cost is PASS_COST's, linear between."""
    assert speculative.pass_cost(1) == 1.0 and speculative.pass_cost(2) == 1.45
    assert speculative.pass_cost(13) == pytest.approx(2.05)  # half way from 9 to 17
    copies, rare = Gate(first=[98.0, 89.0], further=[997.0, 898.0]), \
        Gate(first=[98.0, 24.0], further=[98.0, 48.0])
    assert copies.rates() == pytest.approx((0.9, 0.9), abs=1e-3)
    assert copies.best(16) == 16 and copies.value(16) > 2
    assert rare.value(rare.best(16)) < 1.0 < speculative.MIN_PAYOFF
    assert rare.proposals(16) == 16  # (no pass of its own yet)
    rare.record(16, 1, True)
    assert not rare.open() and copies.proposals(16) == 16


REPEATING = [3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 6, 7, 8, 9, 10, 3, 4]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("pos,block,new,penalty", [("rope", 64, 40, 1.0), ("rope", 32, 40, 1.0),
                                                    ("learned", 32, 40, 1.0),
                                                    ("rope", 64, 40, 1.3)])
def test_greedy_speculation_writes_the_plain_greedy_tokens(engine, pos, block, new, penalty,
                                                          monkeypatch):
    """Within the context and past it (block 32: the speculation stops when the cache is full
    and plain decoding goes on), with the repetition penalty (which the proposals' own tokens
    change); and proposals were taken (fewer forward passes than tokens). The gate never
    pauses here (MIN_PAYOFF 0), so proposals are checked at every step."""
    monkeypatch.setattr(speculative, "MIN_PAYOFF", 0.0)
    lm = Counted(make_lm(engine, block=block, pos=pos))
    plain_cfg = SampleConfig(max_new_tokens=new, temperature=0.0, repetition_penalty=penalty)
    spec_cfg = SampleConfig(max_new_tokens=new, temperature=0.0, repetition_penalty=penalty,
                            speculate=4)
    plain = [s.token for s in generate(lm, REPEATING, plain_cfg)]
    assert lm.passes == 0
    lm.decodes = 0
    speculated = [s.token for s in generate(lm, REPEATING, spec_cfg)]
    assert speculated == plain
    assert lm.checked > lm.passes  # proposals were checked ...
    assert lm.passes + lm.decodes < new - 1  # ... and taken: fewer forward passes than tokens


def chi2_quantile(df: int, z: float) -> float:
    """The chi-square(df) quantile at the normal quantile z (Wilson and Hilferty, 1931:
    (X/df)^(1/3) is nearly normal with mean 1 - 2/(9 df), variance 2/(9 df))."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def exact_joint(lm, prompt, cfg, length):
    """P(t_1..t_length) of plain sampling: the product of each step's filtered distribution
    (the same filters as sheepop.generation.generate.next_token), by enumeration."""
    V = lm.full(prompt).shape[-1]
    joint = {}
    for seq in itertools.product(range(V), repeat=length):
        p = 1.0
        for i in range(length):
            ids = prompt + list(seq[:i])
            seen = np.zeros(V, dtype=bool)
            seen[ids] = True
            z = filtered_logits(lm.full(ids), seen, cfg.repetition_penalty)
            p *= probabilities(z, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)[seq[i]]
            if p == 0.0:
                break
        joint[seq] = p
    return joint


def test_speculative_sampling_keeps_the_models_distribution():
    """The first three of four tokens after a prompt holding every bigram (0, t), ending on 0:
    the first is drawn
    plainly, the second and third by one checking pass of 2 proposals (each accepted, or the
    residual drawn), under temperature, top-k, top-p, min-p and the repetition penalty. The
    empirical joint of N draws (seeds 0..N-1) against the exact one: Pearson's X^2 over the
    cells expected >= 5 times (the rest pooled) stays below chi-square(df)'s 1 - 1e-6 quantile
    (z = 4.75): a correct rule fails it once in a million seeds; drawing the rejected token
    from p instead of the residual (p(d) too high by p(d)(1 - p(d))) gave X^2 = 781 here."""
    V, N = 4, 2000
    lm = Counted(make_lm("numpy", vocab=V, seed=6, scale=0.5))
    prompt = [0, 0, 1, 2, 0, 1, 2, 3, 0, 2, 3, 1, 0, 3, 1, 2, 0]  # (0, t) for every t, each
    # followed by 2 tokens: whatever the first token, the lookup proposes 2
    cfg = SampleConfig(max_new_tokens=4, temperature=0.9, top_k=3, top_p=0.97, min_p=0.02,
                       repetition_penalty=1.3, speculate=2)
    joint = exact_joint(lm, prompt, cfg, 3)
    counts = dict.fromkeys(joint, 0)
    for seed in range(N):
        cfg.seed = seed
        lm.sizes = []
        counts[tuple(s.token for s in generate(lm, prompt, cfg))[:3]] += 1
        assert lm.sizes[0] == 3  # tokens 2 and 3 came from one check of 2 proposals
    big = [s for s in joint if joint[s] * N >= 5]
    rest_expected = N * sum(joint[s] for s in joint if s not in big)
    rest_observed = sum(counts[s] for s in joint if s not in big)
    assert sum(counts[s] for s in joint if joint[s] == 0.0) == 0  # nothing the filters cut
    x2 = sum((counts[s] - N * joint[s]) ** 2 / (N * joint[s]) for s in big)
    df = len(big) - 1
    if rest_expected >= 5:
        x2 += (rest_observed - rest_expected) ** 2 / rest_expected
        df += 1
    assert df >= 10
    assert x2 < chi2_quantile(df, 4.75), (x2, df)


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 6},
    "role": {"enum": ["admin", "user", "guest"]},
    "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
               "minItems": 1, "maxItems": 3}},
    "required": ["name", "role", "scores"], "additionalProperties": False}
JSON_TEXT = '{"name": "Ada", "role": "admin", "scores": [1, 2]} the cat {"name": "Bo"} null'


@pytest.fixture(scope="module")
def json_model():
    """A random 1-layer model over a 300-id BPE vocabulary learnt from JSON-like text."""
    from sheepop.model import GPT
    from sheepop.tokenizers import train_tokenizer
    tok = train_tokenizer("bpe", [JSON_TEXT] * 3, 300)
    cfg = Config()
    cfg.model.vocab_size = tok.vocab_size
    cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size = 1, 2, 32, 512
    return build(cfg, GPT(cfg.model).numpy_weights(), tok, "numpy", "cpu")


def test_a_structured_output_mask_applies_to_every_checked_position(json_model, monkeypatch):
    """A schema's mask at each position of a pass (its state takes the kept tokens only):
    greedy output equal to plain greedy under the same schema, proposals from the prompt's
    JSON checked; and sampled answers all validate."""
    import json

    import jsonschema

    from sheepop.generation.constraint import ConstraintSpec, compile_constraint
    monkeypatch.setattr(speculative, "MIN_PAYOFF", 0.0)
    tok = json_model.tokenizer
    constraint = compile_constraint(ConstraintSpec("json_schema", SCHEMA), tok)
    lm, prompt = Counted(json_model.lm), tok.encode(JSON_TEXT + " " + JSON_TEXT)

    def answer(**kw):
        cfg = SampleConfig(**{"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                              "max_new_tokens": 200, **kw})
        out = [s.token for s in generate(lm, prompt, cfg, eos_id=tok.eos_id,
                                         constraint=constraint.start({tok.eos_id}))]
        assert out[-1] == tok.eos_id
        return out
    plain = answer()
    assert lm.passes == 0
    assert answer(speculate=6) == plain
    assert lm.checked > lm.passes > 0
    for seed in range(4):
        text = tok.decode(answer(temperature=1.0, seed=seed, speculate=6)[:-1])
        jsonschema.validate(json.loads(text), SCHEMA)
