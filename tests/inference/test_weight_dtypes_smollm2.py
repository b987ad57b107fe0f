"""SmolLM2-135M with int8 and int4 weights (sheepop.model.quantized*): the same answer to a
factual prompt as float32, bits per byte within 0.01 of float32's on a text it has seen (this
repository's LICENSE), and int4 running on the GGUF's own Q4_1 blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sheepop.data.windows import eval_windows
from sheepop.inference.load import build, read_run
from sheepop.tokenizers.token_bytes import TargetBytes, bits_per_byte

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("one_torch_thread")]
LICENSE = Path(__file__).resolve().parents[2] / "LICENSE"


@pytest.fixture(scope="module")
def smollm2(smollm2_run):
    return read_run(smollm2_run)


def test_int8_and_int4_answer_and_score_as_float32(smollm2):
    config, tokenizer, weights = smollm2
    ids = tokenizer.encode("The capital of France is")
    stream = np.asarray(tokenizer.encode(LICENSE.read_text())[:257])
    x, y = eval_windows(stream, 256, 1, tokenizer.pad_id or 0)
    n_bytes = TargetBytes(tokenizer).count(x, y)
    bpb, answer = {}, {}
    for dtype in ("float32", "int8", "int4"):
        model = build(config, weights, tokenizer, "torch", "cpu", dtype)
        answer[dtype] = tokenizer.decode(model.lm.greedy(np.array([ids]), 2)[0].tolist())
        bpb[dtype] = bits_per_byte(model.loss_sum(x, y)[0], n_bytes)
    assert answer == {d: " Paris." for d in answer}, answer
    assert abs(bpb["int8"] - bpb["float32"]) < 0.01, bpb
    assert abs(bpb["int4"] - bpb["float32"]) < 0.01, bpb
    assert bpb["int8"] != bpb["float32"] and bpb["int4"] != bpb["float32"], bpb
