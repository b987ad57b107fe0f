"""The field's evaluation harness against `sheepop serve` on a real model.

lm-evaluation-harness (`lm_eval`) scores a multiple-choice task from a local JSON Lines file
through its `local-completions` model: for every (question, choice) it asks
`/v1/completions` for the log-probabilities of the prompt's tokens (`echo`, `logprobs`,
`max_tokens` 1), with the model's tokenizer exported as a Hugging Face tokenizer to count the
question's tokens. Its accuracy must be exactly what sheepop computes in this process from the
same model's log-likelihoods: the harness, the server's echo and the tokenizer export all agree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import ServerProcess

from sheepop.inference.load import load
from sheepop.interop.hf_tokenizer import export_tokenizer

pytest.importorskip("lm_eval")

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

# (the start of a sentence, its true ending, three wrong ones): facts a 135M model knows well
# enough to be scored above chance, and some it does not.
FACTS = [
    ("The capital of France is", "Paris", "London", "Rome", "Madrid"),
    ("The capital of Germany is", "Berlin", "Munich", "Vienna", "Prague"),
    ("The largest planet in the solar system is", "Jupiter", "Mars", "Venus", "Mercury"),
    ("Water freezes at a temperature of zero degrees", "Celsius", "Kelvin", "Newton", "Volts"),
    ("The opposite of hot is", "cold", "warm", "blue", "fast"),
    ("A week has seven", "days", "months", "years", "hours"),
    ("The sun rises in the", "east", "west", "north", "south"),
    ("Bees make", "honey", "milk", "silk", "glass"),
    ("The chemical symbol for water is", "H2O", "CO2", "NaCl", "O3"),
    ("Two plus two equals", "four", "five", "three", "six"),
    ("The color of the sky on a clear day is", "blue", "green", "red", "purple"),
    ("The author of Romeo and Juliet is William", "Shakespeare", "Wordsworth", "Blake", "Penn"),
]

TASK = """task: sheepop_facts
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def write_task(folder: Path) -> Path:
    rows = [{"question": q, "choices": list(c), "answer": 0} for q, *c in FACTS]
    data = folder / "facts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "sheepop_facts.yaml").write_text(TASK.format(data=data))
    return folder


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def sheepop_accuracy(model) -> float:
    """The same score in this process: for each question, the choice whose tokens (those of
    question + " " + choice after the question's, as lm-eval splits them) are the most likely,
    through the KV cache: the question prefilled, then each choice token decoded."""
    tok, lm, right = model.tokenizer, model.lm, 0
    for question, *choices in FACTS:
        context = tok.encode(question)
        scores = []
        for choice in choices:
            whole = tok.encode(question + " " + choice)
            assert whole[:len(context)] == context
            logits, score = lm.prefill(context), 0.0
            for token in whole[len(context):]:
                score += log_softmax(logits)[token]
                logits = lm.decode(token)
            scores.append(score)
        right += int(np.argmax(scores) == 0)
    return right / len(FACTS)


def test_lm_eval_scores_the_served_model_as_sheepop_does(smollm2_run, tmp_path):
    tokenizer_dir = tmp_path / "hf-tokenizer"
    tokenizer_dir.mkdir()
    model = load(smollm2_run, "torch", device="cpu")
    assert export_tokenizer(model.tokenizer, tokenizer_dir, model.config.model.block_size) == []
    (tmp_path / "tasks").mkdir()
    tasks = write_task(tmp_path / "tasks")
    server = ServerProcess(smollm2_run, "--model-name", "smollm2")
    try:
        out = tmp_path / "results"
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run(
            [sys.executable, "-m", "lm_eval", "--model", "local-completions",
             "--model_args", f"model=smollm2,base_url={server.url}/v1/completions,"
             f"tokenizer={tokenizer_dir},tokenizer_backend=huggingface,num_concurrent=4,"
             "max_retries=1,timeout=120",
             "--tasks", "sheepop_facts", "--include_path", str(tasks),
             "--output_path", str(out)], capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        assert server.stop(signal.SIGTERM) == 0
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    acc = results["results"]["sheepop_facts"]["acc,none"]
    print(f"lm-eval sheepop_facts acc {acc:.4f} over {len(FACTS)} questions")
    assert acc == pytest.approx(sheepop_accuracy(model), abs=1e-9)
    assert acc >= 0.75  # well above the 0.25 of chance: the model knows these facts
