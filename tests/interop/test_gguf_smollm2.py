"""SmolLM2-135M-Instruct from its GGUF file (Q4_1 and Q8_0 tensors), imported by sheepop and
compared with `transformers`' GGUF loader on the same file in float32: the logits of several
prompts within 1e-4 in both engines, 64 greedy tokens identical, " Paris" after "The capital of
France is"; and the imported run exported back to GGUF reads through transformers to the same
logits. Token ids come from transformers' tokenizer, so these tests do not depend on sheepop's.
transformers' model is loaded once for the module (~25 s)."""

import time

import numpy as np
import pytest
import torch

from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate
from sheepop.inference.load import load, never_generated
from sheepop.interop.gguf_export import export_gguf

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.real_model

PROMPTS = ["The capital of France is",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "<|im_start|>user\nWhat is 12 times 12?<|im_end|>\n<|im_start|>assistant\n",
           "Les moutons broutent l'herbe du pré, et le berger"]


@pytest.fixture(scope="module")
def reference(smollm2_gguf_path):
    """transformers' model (float32) and tokenizer, from the same GGUF file."""
    d, name = smollm2_gguf_path.parent, smollm2_gguf_path.name
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name,
                                                              dtype=torch.float32).eval()
    return model, tok


def all_logits(lm, ids: list[int]) -> np.ndarray:
    """(len(ids), V): the prompt's first half prefilled, then one decode step a token."""
    half = max(1, len(ids) // 2)
    rows = [lm.prefill(ids[:half])] + [lm.decode(t) for t in ids[half:]]
    return np.stack(rows)


def test_smollm2_logits_equal_transformers_in_both_engines(smollm2_run, reference):
    model, tok = reference
    for engine in ("torch", "numpy"):
        lm = load(smollm2_run, engine=engine, device="cpu").lm
        for prompt in PROMPTS:
            ids = tok(prompt)["input_ids"]
            with torch.no_grad():
                expected = model(torch.tensor([ids])).logits[0].numpy()
            half = max(1, len(ids) // 2)
            got = all_logits(lm, ids)
            np.testing.assert_allclose(got, expected[half - 1:], atol=1e-4, rtol=0,
                                       err_msg=f"{engine}: {prompt!r}")


def test_smollm2_says_paris_and_continues_greedily_as_transformers(smollm2_run, reference):
    model, tok = reference
    run = load(smollm2_run, engine="torch", device="cpu")
    ids = tok("The capital of France is")["input_ids"]
    assert tok.decode([int(np.argmax(run.lm.full(ids)))]) == " Paris"
    # 64 greedy tokens, each side on its own KV cache; sheepop never draws padding, BOS or
    # unknown (sheepop.inference.load.never_generated), so neither does transformers' loop here, and
    # neither stops at the end of turn (transformers' generate(min_new_tokens=...) would ban
    # it outright instead).
    ours = [s.token for s in generate(run.lm, ids, SampleConfig(max_new_tokens=64,
                                                                 temperature=0.0))]
    banned = never_generated(run.tokenizer)
    theirs, past, step = [], None, ids
    with torch.no_grad():
        for _ in range(64):
            out = model(torch.tensor([step]), past_key_values=past, use_cache=True)
            logits = out.logits[0, -1].clone()
            logits[banned] = -float("inf")
            past, step = out.past_key_values, [int(logits.argmax())]
            theirs += step
    assert ours == theirs
    assert len(set(ours)) > 10  # a text, not one token repeated


def test_the_imported_smollm2_exports_to_gguf_that_transformers_reads(smollm2_run, reference,
                                                                       tmp_path, capsys):
    clock = time.perf_counter()
    assert export_gguf(smollm2_run, tmp_path / "smollm2.gguf", "f32") == []
    took = time.perf_counter() - clock
    size = (tmp_path / "smollm2.gguf").stat().st_size
    with capsys.disabled():
        print(f"\nSmolLM2 exported to GGUF f32 in {took:.1f} s ({size / 2**20:.0f} MiB)")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="smollm2.gguf", dtype=torch.float32).eval()
    assert (hf.config.num_hidden_layers, hf.config.num_key_value_heads) == (30, 3)
    lm = load(smollm2_run, engine="torch", device="cpu").lm
    ids = reference[1]("The capital of France is Paris, and the capital of Italy is")["input_ids"]
    with torch.no_grad():
        got = hf(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(got, lm.full(ids), atol=1e-4, rtol=0)
