"""SmolLM2-135M with int8 and int4 weights (sheepop.model.quantized*): the same answer to a
factual prompt as float32, bits per byte within 0.01 of float32's on a text it has seen (this
repository's LICENSE); and the NumPy engine's int4 and int8 holding the GGUF file's own Q4_1
and Q8_0 blocks, byte for byte."""

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


def test_the_numpy_engines_narrow_weights_are_the_files_own_blocks(smollm2, smollm2_gguf_path):
    """Imported to float32 and narrowed again, each matrix is the file's blocks: the Q4_1
    ffn_down of every seventh layer in int4 (d and m, and qs in Q4_1's own byte order), the
    Q8_0 token table in int8 (d and qs), as llama.cpp reads them."""
    from gguf import GGUFReader

    from sheepop.scratch.narrow import Int4Weight, Int8Weight
    _, _, weights = smollm2
    tensors = {t.name: t for t in GGUFReader(str(smollm2_gguf_path)).tensors}
    table = tensors["token_embd.weight"]
    assert table.tensor_type.name == "Q8_0"
    raw = np.asarray(table.data).reshape(-1, 34)
    table_held = Int8Weight(weights["tok_emb.weight"])
    q, d = table_held.q, table_held.scale
    np.testing.assert_array_equal(d.reshape(-1, 1).view(np.uint8), raw[:, :2])
    np.testing.assert_array_equal(q.reshape(-1, 32).view(np.uint8), raw[:, 2:])
    for layer in range(0, 30, 7):
        down = tensors[f"blk.{layer}.ffn_down.weight"]
        assert down.tensor_type.name == "Q4_1"
        raw = np.asarray(down.data).reshape(-1, 20)
        held = Int4Weight(weights[f"blocks.{layer}.ffn.proj.weight"])
        np.testing.assert_array_equal(held.packed.reshape(-1, 16), raw[:, 4:])
        for got, at in ((held.scale, 0), (held.low, 2)):
            np.testing.assert_array_equal(
                got.ravel(), raw[:, at:at + 2].copy().view(np.float16).astype(np.float32)[:, 0])
