"""`sheepop import` of a Hugging Face directory whose tokenizer.json gives a token a huge id
(issue 41, section 5): refused in one line naming the id before anything is sized by it (an id
of 500,000,000 made a 3.9 GB table first, 10^12 a MemoryError traceback)."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from cli_refusal import fails
from variants import llama

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.interop import export_llama
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.file_checks import MAX_TOKEN_ID


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A Hugging Face Llama directory exported from a random tiny sheepop model."""
    root = tmp_path_factory.mktemp("hf-ids")
    tok = train_tokenizer("bpe", ["the quick brown fox jumps over the lazy dog. " * 40],
                          vocab_size=300)
    config = Config()
    config.model = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2,
                               n_embd=16, d_ff=24, **llama(tie_weights=True))
    rng = np.random.default_rng(0)
    weights = {k: (rng.standard_normal(s) * 0.1).astype(np.float32)
               for k, s in param_shapes(config.model).items()}
    checkpoint.save_checkpoint(root / "run", weights, config.to_dict(), tok.to_json())
    export_llama(root / "run", root / "hf")
    return root / "hf"


@pytest.mark.parametrize("huge", [500_000_000, 10**12, MAX_TOKEN_ID + 1])
def test_a_huge_token_id_is_refused_before_anything_is_sized(exported, tmp_path, capsys,
                                                              huge):
    path = exported / "tokenizer.json"
    original = path.read_text()
    data = json.loads(original)
    data["added_tokens"].append({"id": huge, "content": "<|far|>", "single_word": False,
                                 "lstrip": False, "rstrip": False, "normalized": False,
                                 "special": True})
    path.write_text(json.dumps(data))
    tracemalloc.start()
    try:
        line = fails(capsys, ["import", str(exported), str(tmp_path / "run")],
                     f"token id {huge} is outside 0..{MAX_TOKEN_ID:,}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        path.write_text(original)
    assert "tokenizer.json" in line and not (tmp_path / "run").exists()
    # Python's allocations while importing: the modules import loads (~70 MB), the file and
    # its parse; a table of 500,000,000 ids alone would be 4 GB
    assert peak < 500 * 2**20, peak


def test_the_largest_id_allowed_is_far_above_real_vocabularies():
    assert MAX_TOKEN_ID >= 64 * 262_144 - 1  # Gemma 3's vocabulary, the largest published
