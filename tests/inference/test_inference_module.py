"""sheepop.inference.load: one place builds a model for inference, in either engine, and the
tokens a model must never generate are left out by every generation loop."""

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, SampleConfig
from sheepop.errors import UserError
from sheepop.generation.generate import generate, generate_batch_ids
from sheepop.generation.text_stream import generate_texts, stream_text
from sheepop.inference.load import build, load, never_generated
from sheepop.model import GPT
from sheepop.tokenizers import IncrementalDecoder, train_tokenizer

TEXT = "the cat sat on the mat. "


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer("char", [TEXT], 0)


def pad_loving_weights(cfg: Config, tokenizer) -> dict[str, np.ndarray]:
    """A model whose output bias makes padding (and BOS, unknown) by far the likeliest token."""
    weights = GPT(cfg.model).numpy_weights()
    weights["head.bias"] = np.zeros(cfg.model.vocab_size, dtype=np.float32)
    for i in never_generated(tokenizer):
        weights["head.bias"][i] = 50.0 + i
    return weights


@pytest.fixture(scope="module")
def config(tokenizer) -> Config:
    cfg = Config()
    cfg.model.vocab_size = tokenizer.vocab_size
    cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size = 1, 2, 16, 16
    cfg.model.head_bias = True
    return cfg


def test_the_never_generated_ids_are_the_tokenizers_pad_bos_and_unknown(tokenizer):
    assert sorted(never_generated(tokenizer)) == sorted(
        [tokenizer.pad_id, tokenizer.bos_id, tokenizer.unk_id])
    assert tokenizer.eos_id not in never_generated(tokenizer)  # EOS ends generation


def test_an_eos_that_is_also_the_padding_is_still_generated():
    from types import SimpleNamespace
    smollm2 = SimpleNamespace(pad_id=2, bos_id=1, unk_id=0, eos_id=2)  # <|im_end|> pads
    assert never_generated(smollm2) == [1, 0]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_every_generation_loop_leaves_out_the_never_generated_tokens(config, tokenizer, engine):
    weights = pad_loving_weights(config, tokenizer)
    never = set(never_generated(tokenizer))
    prompt = tokenizer.encode("the cat")
    raw = build(config, weights, None, engine, "cpu").lm  # no tokenizer: nothing left out
    assert raw.never_generate == ()
    greedy = SampleConfig(max_new_tokens=12, temperature=0.0)
    assert {s.token for s in generate(raw, prompt, greedy)} <= never  # what it would say

    lm = build(config, weights, tokenizer, engine, "cpu").lm
    assert set(lm.never_generate) == never
    for cfg in (greedy, SampleConfig(max_new_tokens=12, temperature=1.0, seed=3)):
        single = [s.token for s in generate(lm, prompt, cfg, show_probs=3)]
        assert len(single) == 12 and not never & set(single)
        batch = generate_batch_ids(lm, [prompt, tokenizer.encode("a")], cfg)
        assert batch[0] == single and not never & set(batch[1])
    shown = next(iter(generate(lm, prompt, greedy, show_probs=len(never) + 1))).top
    assert not never & {i for i, p in shown if p > 0}
    decoder = IncrementalDecoder(tokenizer)
    text = "".join(stream_text(lm, prompt, greedy, decoder))
    assert text == tokenizer.decode([s.token for s in generate(lm, prompt, greedy)])
    texts = generate_texts(lm, [prompt], greedy, [IncrementalDecoder(tokenizer)])
    assert texts == [text]
    contexts = np.array([prompt, prompt])
    assert not never & set(lm.greedy(contexts, 4).ravel().tolist())


def test_load_gives_both_engines_the_same_model(config, tokenizer, tmp_path):
    weights = GPT(config.model).numpy_weights()
    checkpoint.save_checkpoint(tmp_path, weights, config.to_dict(), tokenizer.to_json())
    torch_model, numpy_model = load(tmp_path, "torch", "cpu"), load(tmp_path, "numpy")
    assert (torch_model.engine, numpy_model.engine) == ("torch", "numpy")
    assert torch_model.tokenizer.to_json() == tokenizer.to_json()
    ids = tokenizer.encode(TEXT[:12])
    np.testing.assert_allclose(torch_model.lm.full(ids), numpy_model.lm.full(ids), atol=1e-5)
    x = np.array([ids[:-1]])
    y = np.array([ids[1:]])
    y[0, :3] = -1  # IGNORE_INDEX: not counted
    (a, n), (b, m) = torch_model.loss_sum(x, y), numpy_model.loss_sum(x, y)
    assert n == m == len(ids) - 4 and a == pytest.approx(b, rel=1e-5)


def test_bad_choices_are_one_clear_error(config, tokenizer):
    weights = GPT(config.model).numpy_weights()
    with pytest.raises(UserError, match="inference dtype must be one of float32, bfloat16"):
        build(config, weights, tokenizer, dtype="float16")
    with pytest.raises(UserError, match="--compile needs --engine torch"):
        build(config, weights, tokenizer, engine="numpy", compile=True)
    with pytest.raises(UserError, match="unknown engine 'jax'"):
        build(config, weights, tokenizer, engine="jax")


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("rows", [512, 7, 1])
def test_evaluation_in_chunks_of_positions_is_one_pass_over_each_window(
        config, tokenizer, engine, rows, monkeypatch):
    """loss_sum runs the windows through a KV cache CHUNK_ROWS positions at a time (512: the
    three windows in one pass; 7: a window at a time, in chunks of 7, 7 and 2 positions; 1:
    one position at a time): the sum equals the cross-entropy of one uncached forward pass
    over the windows (torch's, in float64), padding left out."""
    import torch
    import torch.nn.functional as F

    from sheepop.generation import cached_lm as cached_lm
    from sheepop.model.gpt import GPT as TorchGPT

    monkeypatch.setattr(cached_lm, "CHUNK_ROWS", rows)
    torch.manual_seed(1)
    reference = TorchGPT(config.model).eval()
    model = build(config, reference.numpy_weights(), tokenizer, engine, "cpu")
    ids = tokenizer.encode(TEXT * 3)
    x = np.array([ids[:16], ids[16:32], ids[32:48]])
    y = np.array([ids[1:17], ids[17:33], ids[33:49]])
    y[2, 11:] = -1  # the last window padded
    with torch.no_grad():
        logits, _ = reference(torch.from_numpy(x))
        expected = F.cross_entropy(logits.double().flatten(0, 1), torch.from_numpy(y).flatten(),
                                   ignore_index=-1, reduction="sum").item()
    total, n = model.loss_sum(x, y)
    assert n == 3 * 16 - 5 and total == pytest.approx(expected, rel=2e-6)


def test_a_cached_numpy_forward_keeps_nothing_for_a_backward(config):
    """Generation and evaluation go through the KV cache: no layer's cache is kept (a long
    prompt's attention weights, layer after layer, ran SmolLM2's evaluation out of memory), and
    a backward pass through such a forward is refused by name."""
    from sheepop.scratch.gpt import gpt_backward, gpt_forward, new_cache
    weights = GPT(config.model).numpy_weights()
    x = np.array([[1, 2, 3, 4]])
    _, loss, cache = gpt_forward(weights, config.model, x, x)
    assert len(cache.blocks) == config.model.n_layer
    _, loss, cache = gpt_forward(weights, config.model, x, x, cache=new_cache(config.model))
    assert cache.blocks == []
    with pytest.raises(ValueError, match="a forward without a KV cache"):
        gpt_backward(cache)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_a_prompt_in_passes_of_a_few_positions_gives_the_logits_of_one_pass(
        config, tokenizer, engine, monkeypatch):
    """Prompts go through the KV cache CHUNK_ROWS positions a pass (3 here; 512 in use, so that
    an 8,000-token prompt holds 150 MB of attention scores a layer, not 2.4 GB): the logits
    after one prompt, after each left-padded prompt of a batch (their positions and padding
    sliced to each pass), after a server's joining prompts and at every position of an echoed
    prompt equal those of one pass without a cache."""
    from sheepop.generation import cached_lm as cached_lm
    from sheepop.generation.running_batch import RunningBatch

    lm = build(config, GPT(config.model).numpy_weights(), tokenizer, engine, "cpu").lm
    long, short = tokenizer.encode(TEXT[:11]), tokenizer.encode(TEXT[3:7])
    one_pass = {"prefill": lm.prefill(long), "batch": lm.prefill_batch([long, short]),
                "echo": lm.prompt_logits(long)}
    monkeypatch.setattr(cached_lm, "CHUNK_ROWS", 3)
    np.testing.assert_allclose(lm.prefill(long), one_pass["prefill"], atol=1e-5)
    np.testing.assert_allclose(lm.prefill(long), lm.full(long), atol=1e-5)
    np.testing.assert_allclose(lm.prefill_batch([long, short]), one_pass["batch"], atol=1e-5)
    np.testing.assert_allclose(lm.prefill_batch([long, short])[1], lm.full(short), atol=1e-5)
    np.testing.assert_allclose(lm.prompt_logits(long), one_pass["echo"], atol=1e-5)
    joined = RunningBatch(lm, 2).join([long, short])
    np.testing.assert_allclose(joined, one_pass["batch"], atol=1e-5)
