"""Structured output (sheepop.generation.constraint): a JSON schema, any JSON object or a regular
expression enforced as a token mask over the model's own vocabulary, in the single and the
batched loop, on a small random model made here (whose unconstrained text is noise) and on
SmolLM2 (marked real_model)."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from sheepop.config.schema import Config, SampleConfig
from sheepop.errors import UserError
from sheepop.generation.constraint import (
    ConstraintSpec,
    UnsupportedConstraint,
    compile_constraint,
)
from sheepop.generation.generate import generate, generate_batch_ids, next_token
from sheepop.generation.number_digits import (
    IN_STRING,
    MANTISSA,
    MAX_DIGITS,
    MAX_EXPONENT_DIGITS,
    NONE,
    OUTSIDE,
    DigitTable,
    Place,
)
from sheepop.inference.load import build
from sheepop.model import GPT
from sheepop.tokenizers import train_tokenizer

# Bounded everywhere (strings, arrays, integers), so a random model's samples must end.
NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "ok": {"type": "boolean"},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                   "minItems": 1, "maxItems": 3},
        "address": {"type": "object", "properties": {
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "kind": {"const": "home"}}, "required": ["zip", "kind"],
            "additionalProperties": False},
    },
    "required": ["name", "age", "role", "scores", "address"],
    "additionalProperties": False,
}
SMALL = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["n"], "additionalProperties": False}
CORPUS = ('{"name": "Ada", "age": 36, "role": "admin", "scores": [1, 2], "address": '
          '{"zip": "12345", "kind": "home"}, "ok": true} the cat sat on the mat. 0123456789 '
          'abc-12 xyz-99 [] {} null false')


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer("bpe", [CORPUS] * 3, 300)


@pytest.fixture(scope="module")
def model(tokenizer):
    """A random 1-layer model over a 300-id BPE vocabulary: its text is noise without a mask."""
    cfg = Config()
    cfg.model.vocab_size = tokenizer.vocab_size
    cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size = 1, 2, 32, 512
    return build(cfg, GPT(cfg.model).numpy_weights(), tokenizer, "numpy", "cpu")


def sample_cfg(**kw) -> SampleConfig:
    return SampleConfig(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                           "max_new_tokens": 400, **kw})


def texts(tokenizer, outputs: list[list[int]]) -> list[str]:
    """Each output's text; every output must have ended on EOS (a complete text)."""
    assert all(o and o[-1] == tokenizer.eos_id for o in outputs), [len(o) for o in outputs]
    return [tokenizer.decode(o[:-1]) for o in outputs]


def states(model, spec, n):
    constraint = compile_constraint(spec, model.tokenizer)
    return [constraint.start({model.tokenizer.eos_id}) for _ in range(n)]


def test_every_sample_of_a_nested_schema_validates_and_without_the_mask_none_does(model):
    tok, prompt = model.tokenizer, model.tokenizer.encode("the cat")
    spec, seeds = ConstraintSpec("json_schema", NESTED), list(range(12))
    outputs = generate_batch_ids(model.lm, [prompt] * 12, sample_cfg(), eos_id=tok.eos_id,
                                 seeds=seeds, constraints=states(model, spec, 12))
    for text in texts(tok, outputs):
        jsonschema.validate(json.loads(text), NESTED)
    # the same draws without the mask: the model itself writes no JSON at all
    free = generate_batch_ids(model.lm, [prompt] * 12, sample_cfg(max_new_tokens=40),
                              eos_id=tok.eos_id, seeds=seeds)
    assert not any(_parses(tok.decode([t for t in o if t != tok.eos_id])) for o in free)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_json_object_gives_an_object_that_parses(model):
    tok = model.tokenizer
    # greedy and sampled: any JSON object, the model's own choice of keys and values
    for cfg in (sample_cfg(temperature=0.0), sample_cfg(temperature=0.7, top_k=20)):
        for seed in range(3):
            state = states(model, ConstraintSpec("json_object"), 1)[0]
            out = [s.token for s in generate(model.lm, tok.encode("abc"),
                                             sample_cfg(**{**cfg.__dict__, "seed": seed}),
                                             eos_id=tok.eos_id, constraint=state)]
            if out[-1] != tok.eos_id:  # (cut by max_new_tokens: a valid prefix, not a text)
                continue
            assert isinstance(json.loads(tok.decode(out[:-1])), dict)


def test_a_regex_is_matched_whole(model):
    tok, pattern = model.tokenizer, r"[a-z]{3}-[0-9]{2}( ok)?"
    spec = ConstraintSpec("regex", pattern)
    outputs = generate_batch_ids(model.lm, [tok.encode("xyz")] * 10, sample_cfg(),
                                 eos_id=tok.eos_id, seeds=range(10),
                                 constraints=states(model, spec, 10))
    for text in texts(tok, outputs):
        assert re.fullmatch(pattern, text), text


def test_batched_rows_keep_their_own_constraint_and_draw_what_they_draw_alone(model):
    """Rows with different schemas (and one without any) in one batch: each row's tokens are
    those it draws alone with its seed, and each validates against its own schema."""
    tok = model.tokenizer
    specs = [ConstraintSpec("json_schema", NESTED), ConstraintSpec("json_schema", SMALL),
             ConstraintSpec("regex", r"[0-9]{4}"), None]
    prompts = [tok.encode(p) for p in ("the cat", "sat on the mat", "abc", "the")]
    cfg = sample_cfg(max_new_tokens=300)
    constraints = [None if s is None else states(model, s, 1)[0] for s in specs]
    together = generate_batch_ids(model.lm, prompts, cfg, eos_id=tok.eos_id, seeds=range(4),
                                  constraints=constraints)
    for b, (spec, prompt) in enumerate(zip(specs, prompts)):
        alone_state = None if spec is None else states(model, spec, 1)[0]
        alone = [s.token for s in generate(model.lm, prompt, sample_cfg(max_new_tokens=300,
                                                                        seed=b),
                                           eos_id=tok.eos_id, constraint=alone_state)]
        assert together[b] == alone
    schema_a, schema_b, digits = texts(tok, together[:3])
    jsonschema.validate(json.loads(schema_a), NESTED)
    jsonschema.validate(json.loads(schema_b), SMALL)
    assert re.fullmatch("[0-9]{4}", digits)


def test_the_mask_comes_before_top_k_and_eos_only_where_the_grammar_ends(model):
    tok = model.tokenizer
    state = states(model, ConstraintSpec("regex", "ab?"), 1)[0]
    V = tok.vocab_size
    first = state.allowed(V)
    a = tok.encode("a")[0]
    assert first[a] and not first[tok.eos_id]  # "" is not a match yet: no end
    z = np.zeros(V)
    z[tok.encode("x")[0]] = 50.0  # the model's favourite is not allowed
    token, _ = next_token(z, sample_cfg(top_k=1), np.random.default_rng(0), allowed=first)
    assert first[token]  # top-k kept the best *allowed* token, not the forbidden favourite
    state.advance(a)
    after = state.allowed(V)
    assert after[tok.eos_id] and after[tok.encode("b")[0]]  # "a" may end, or take "b"
    state.advance(tok.encode("b")[0])
    assert np.flatnonzero(state.allowed(V)).tolist() == [tok.eos_id]  # "ab": nothing else


@pytest.mark.parametrize("keyword, schema", [
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
    ("if", {"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}),
    ("contains", {"type": "array", "contains": {"const": 1}}),
    ("not", {"type": "integer", "not": {"const": 3}}),
    ("oneOf", {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]}),
    ("madeup", {"type": "string", "format": "madeup"}),
])
def test_a_keyword_the_library_cannot_enforce_is_refused_by_name(model, keyword, schema):
    with pytest.raises(UnsupportedConstraint, match=keyword):
        compile_constraint(ConstraintSpec("json_schema", schema), model.tokenizer)


def test_a_bad_regex_and_a_word_tokenizer_are_refused(model):
    with pytest.raises(UnsupportedConstraint, match="unclosed"):
        compile_constraint(ConstraintSpec("regex", "[0-9]{3"), model.tokenizer)
    words = train_tokenizer("word", ["the cat sat"], 0)
    with pytest.raises(UserError, match="word tokenizer"):
        compile_constraint(ConstraintSpec("json_object"), words)


@pytest.mark.real_model
def test_smollm2s_samples_of_a_nested_schema_all_validate(smollm2_run):
    """SmolLM2 at temperature 1, asked in its chat template for a person: 6 samples, batched,
    every one valid JSON of the schema (benchmarks/structured_output.py draws 200)."""
    from sheepop.inference.load import load
    from sheepop.tokenizers.chat_format import chat_ids, turn_end
    model = load(smollm2_run, engine="numpy")
    tok = model.tokenizer
    prompt = chat_ids(tok, [{"role": "user", "content": "Describe a person as JSON."}], True)[0]
    (end,) = turn_end(tok).ids  # <|im_end|>
    constraint = compile_constraint(ConstraintSpec("json_schema", NESTED), tok)
    outputs = generate_batch_ids(model.lm, [prompt] * 6, sample_cfg(max_new_tokens=200),
                                 eos_id=end, seeds=range(6),
                                 constraints=[constraint.start({end}) for _ in range(6)])
    for o in outputs:
        assert o[-1] == end, tok.decode(o)
        jsonschema.validate(json.loads(tok.decode(o[:-1])), NESTED)


def test_json_is_written_as_json_dumps_writes_it():
    """One line, a space after ':' and ',', none elsewhere: after '{"n":' only the space may
    come, after '{"n": 3' only '}' (the object is complete) and no space."""
    tok = train_tokenizer("char", ['{}[]":, 0123456789n\n'])
    state = compile_constraint(ConstraintSpec("json_schema", SMALL), tok).start({tok.eos_id})
    for t in tok.encode('{"n":'):
        state.advance(t)
    allowed = {tok.decode([i]) for i in np.flatnonzero(state.allowed(tok.vocab_size))}
    assert allowed == {" "}
    for t in tok.encode(" 3"):
        state.advance(t)
    assert {tok.decode([i]) for i in np.flatnonzero(state.allowed(tok.vocab_size))} == {"}"}



def _allowed_after(schema, text: str, tok) -> set[str]:
    """What may come after `text` under `schema` ("EOS" for the end)."""
    state = compile_constraint(ConstraintSpec("json_schema", schema), tok).start({tok.eos_id})
    for t in tok.encode(text):
        state.advance(t)
    return {"EOS" if i == tok.eos_id else tok.decode([i])
            for i in np.flatnonzero(state.allowed(tok.vocab_size))}


def _number(kind: str = "number", **bounds) -> dict:
    return {"type": "object", "properties": {"n": {"type": kind, **bounds}},
            "required": ["n"], "additionalProperties": False}


DIGITS = set("0123456789")


@pytest.fixture(scope="module")
def chars():
    return train_tokenizer("char", ['{}[]":, 0123456789n.eE+-'])


def test_a_numbers_digits_stop_at_the_bound_and_the_number_still_ends(chars):
    """15 digits in a number's integer part and fraction, a lone leading 0 not counted: in
    [0, 1] (where the grammar alone lets `1.000...` run forever) `0.` takes 15 and `1.` 14,
    and then only the object's end may come; an integer takes 15; an exponent 3. What the
    bound leaves is a number of the schema."""
    assert (MAX_DIGITS, MAX_EXPONENT_DIGITS) == (15, 3)
    unit = _number(minimum=0, maximum=1)
    assert DIGITS <= _allowed_after(unit, '{"n": 0.' + "1" * 14, chars)
    assert _allowed_after(unit, '{"n": 0.' + "1" * 15, chars) == {"}"}
    assert _allowed_after(unit, '{"n": 1.' + "0" * 13, chars) == {"0", "}"}
    assert _allowed_after(unit, '{"n": 1.' + "0" * 14, chars) == {"}"}
    jsonschema.validate(json.loads('{"n": 0.' + "1" * 15 + "}"), unit)
    assert DIGITS <= _allowed_after(_number("integer"), '{"n": ' + "9" * 14, chars)
    assert _allowed_after(_number("integer"), '{"n": ' + "9" * 15, chars) == {"}"}
    # a 15-digit mantissa may not take a point (its fraction would be the 16th digit)
    assert _allowed_after({"type": "number"}, "9" * 15, chars) == {"e", "E", "EOS"}
    assert _allowed_after({"type": "number"}, "9.5e-" + "1" * 3, chars) == {"EOS"}


def test_where_a_number_at_the_bound_could_not_end_its_last_digit_is_refused(chars):
    """Above an exclusive minimum of 0.5, `0.5` and 14 zeros could only go on with a 16th
    digit: the look ahead refuses that zero and keeps 1-9, which end it within the bound (and
    as a float64 above 0.5, where `0.50000000000000001` is 0.5). Where the schema needs more
    digits than the bound (18 for an integer from 10**17), the grammar keeps its way."""
    schema = _number(exclusiveMinimum=0.5, maximum=0.6)
    assert _allowed_after(schema, '{"n": 0.5' + "0" * 12, chars) == DIGITS
    assert _allowed_after(schema, '{"n": 0.5' + "0" * 13, chars) == DIGITS - {"0"}
    jsonschema.validate(json.loads('{"n": 0.5' + "0" * 13 + "1}"), schema)
    with pytest.raises(jsonschema.ValidationError):  # what the grammar alone let through
        jsonschema.validate(json.loads('{"n": 0.5' + "0" * 15 + "1}"), schema)
    big = _number("integer", minimum=10**17)
    for digits in (14, 15, 17):
        assert _allowed_after(big, '{"n": ' + "1" * digits, chars) == DIGITS


def test_digits_in_strings_are_text_and_a_many_digit_token_is_counted_whole():
    """The bound reads each token's bytes from where the text is: after 13 digits a token of
    2 digits takes the number to 15 and one of 3 would break it; 20 digits inside a string are
    text; from inside a string, its end then a number of 16 digits breaks it."""
    tokens = [b"1", b"00", b"000", b'"', b"1" * 20, b'", 1' + b"2" * 15, b"}", None]
    table = DigitTable(tokens)
    place = Place()
    for _ in range(13):
        place = table.after(place, 0)
    assert place == Place(OUTSIDE, MANTISSA, 13)
    over, edge = table.row(place)
    assert over.tolist() == [False, False, True, False, True, False, False, False]
    assert edge.tolist() == [False, True, False, False, False, False, False, False]
    inside = table.after(table.after(Place(), 3), 4)  # '"' then 20 digits: a string
    assert inside == Place(IN_STRING, NONE, 0)
    assert table.row(inside)[0].tolist() == [False] * 5 + [True, False, False]
    assert table.after(inside, 7) == inside  # a special token writes nothing
