"""Repetition penalty, stop strings and the streaming text API."""

import numpy as np
import pytest

from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate
from sheepop.generation.sample import penalize_repeats
from sheepop.generation.text_stream import StopStrings, generate_texts, stream_text
from sheepop.tokenizers import IncrementalDecoder
from sheepop.tokenizers.char import CharTokenizer

CHARS = "abcdefghijklmnopqrstuvwxyz .,!<>/"  # 33 characters + 4 specials = 37 ids


class ScriptLM:
    """A model that spells out `script` (one-hot logits), counting its forward calls."""

    def __init__(self, script: list[int], vocab: int, prompt_len: int):
        self.script, self.vocab, self.prompt_len = script, vocab, prompt_len
        self.block_size = 1000
        self.cache_length = 0
        self.calls = 0

    def _next(self, n: int) -> np.ndarray:
        self.calls += 1
        z = np.zeros(self.vocab)
        z[self.script[min(n - self.prompt_len, len(self.script) - 1)]] = 10.0
        return z

    def prefill(self, ids):
        self.cache_length = len(ids)
        return self._next(self.cache_length)

    def decode(self, token):
        self.cache_length += 1
        return self._next(self.cache_length)

    def full(self, ids):
        return self._next(len(ids))


@pytest.fixture
def tok() -> CharTokenizer:
    return CharTokenizer(CHARS)


def test_repetition_penalty_by_hand():
    z = np.array([2.0, -1.0, 0.5, 3.0])
    seen = np.array([True, True, False, False])
    assert penalize_repeats(z, seen, 2.0).tolist() == [1.0, -2.0, 0.5, 3.0]
    assert penalize_repeats(z, seen, 1.0).tolist() == z.tolist()


def test_repetition_penalty_changes_greedy_choices():
    class Flat(ScriptLM):
        def _next(self, n):
            return np.array([3.0, 2.9, 2.5, 1.0])

    lm = Flat([0], 4, 1)
    plain = [s.token for s in generate(lm, [3], SampleConfig(max_new_tokens=4, temperature=0))]
    assert plain == [0, 0, 0, 0]
    sc = SampleConfig(max_new_tokens=4, temperature=0, repetition_penalty=1.5)
    # Step 1: 3.0 wins. Step 2: 3.0/1.5 = 2.0 < 2.9. Step 3: 2.9/1.5 = 1.93 < 2.5. Step 4: the
    # prompt token 3 was penalised from the start (1.0/1.5) and 2.5/1.5 = 1.67 < 2.0 = token 0.
    assert [s.token for s in generate(lm, [3], sc)] == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="repetition_penalty"):
        next(generate(lm, [3], SampleConfig(repetition_penalty=0)))


def test_stop_strings_hold_back_only_what_may_start_one():
    cut = StopStrings(["</s>", "END"])
    assert cut.feed("ab") == "ab"
    assert cut.feed("c<") == "c"          # "<" may begin "</s>"
    assert cut.feed("a") == "<a"          # it did not
    assert cut.feed("E") == ""
    assert cut.feed("N") == ""
    assert cut.feed("Dx") == "" and cut.stopped
    assert cut.feed("more") == "" and cut.flush() == ""
    cut = StopStrings(["xyz", "yq"])
    assert cut.feed("axy") == "a"
    assert cut.feed("q!") == "x" and cut.stopped  # "yq" ends first
    cut = StopStrings(["</s>"])
    assert cut.feed("tail </") == "tail " and cut.flush() == "</"


def test_stream_text_stops_at_a_stop_string_and_streams_lazily(tok):
    text = "hello world. the end."
    lm = ScriptLM(tok.encode(text), tok.vocab_size, prompt_len=2)
    sc = SampleConfig(max_new_tokens=100, temperature=0)
    pieces = stream_text(lm, tok.encode("ab"), sc, IncrementalDecoder(tok), stop=[". t"])
    assert next(pieces) == "h" and lm.calls == 1  # the first piece comes after one step
    assert "".join(pieces) == "ello world"
    assert lm.calls == 14  # "hello world. t": generation stopped with the stop string
    whole = stream_text(lm, tok.encode("ab"), sc, IncrementalDecoder(tok), stop=["zzz"])
    assert "".join(whole) == text + "." * 79  # no stop: max_new_tokens
    eos = tok.eos_id
    lm = ScriptLM(tok.encode("hi") + [eos, 5], tok.vocab_size, prompt_len=1)
    out = stream_text(lm, [7], sc, IncrementalDecoder(tok), stop=["i!"], eos_id=eos)
    assert list(out) == ["h", "i"]  # a held "i" is released when the eos token ends it


def test_batched_texts_equal_each_prompt_streamed_alone(small_lm, tok):
    assert small_lm.block_size == 32 and tok.vocab_size == 37
    prompts = [tok.encode(p) for p in ("the cat", "a", "hello there, dog")]
    sc = SampleConfig(max_new_tokens=40, temperature=1.0, seed=4)
    for stop in ([], ["e"], ["a", "</"]):
        batch = generate_texts(small_lm, prompts, sc, [IncrementalDecoder(tok) for _ in prompts],
                               stop=stop, eos_id=tok.eos_id)
        for prompt, text in zip(prompts, batch):
            solo = "".join(stream_text(small_lm, prompt, sc, IncrementalDecoder(tok), stop=stop,
                                       eos_id=tok.eos_id))
            assert text == solo
            assert not any(s in text for s in stop)
    assert any(len(t) < 20 for t in batch)  # some stop string did cut a text short
