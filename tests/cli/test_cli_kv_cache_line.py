"""The KV cache's memory per token, where a user sees it: `sheepop train`'s model line and the
line `sheepop generate` prints on stderr (stdout keeps only the text)."""

import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.build import build_config
from sheepop.config.model_size import describe_kv_cache

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py


@pytest.mark.parametrize("preset, itemsize, line", [
    ("tiny", 4, "KV cache 4.0 KiB/token"),                           # 2 * 4 * 128 * 4 bytes
    ("tiny-llama", 4, "KV cache 2.0 KiB/token (2 of 4 heads)"),      # 2 * 4 * (2 * 32) * 4
    ("llama-small", 4, "KV cache 24.0 KiB/token (4 of 12 heads)"),   # 2 * 12 * (4 * 64) * 4
    ("gpt2-small", 2, "KV cache 36.0 KiB/token"),                    # 2 * 12 * 768 * 2
])
def test_the_kv_cache_line_of_each_preset(preset, itemsize, line):
    assert describe_kv_cache(build_config(preset).model, itemsize) == line


def test_train_and_generate_print_the_kv_cache_per_token(tmp_path, capsys, tiny_text):
    data = tmp_path / "text.txt"
    data.write_text(tiny_text)
    run = tmp_path / "run"
    sets = ["model.n_layer=3", "model.block_size=16", "train.batch_size=2",
            "train.eval_batches=1", "train.warmup_steps=1"]
    assert main(["train", str(data), "--out", str(run), "--preset", "tiny-llama", "--steps", "2",
                 "--no-progress"] + [a for s in sets for a in ("--set", s)]) == 0
    n = sum(w.size for w in checkpoint.load_weights(run).values())
    # 2 (K, V) * 3 layers * 2 key/value heads * 32 wide * 4 bytes = 1,536 bytes per token
    kv = "KV cache 1.5 KiB/token (2 of 4 heads)"
    model_lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("model:")]
    assert model_lines == [f"model: {n:,} parameters (3 layers, 4 heads, width 128, context 16), "
                           f"{kv}; torch on cpu, float32"]
    for engine, dtype, kv_text in [("torch", "float32", kv), ("numpy", "float32", kv),
                                   ("torch", "bfloat16", "KV cache 768 B/token (2 of 4 heads)"),
                                   ("numpy", "bfloat16", kv)]:  # the NumPy engine's: float32
        assert main(["generate", str(run), "--prompt", "the ", "--max-new-tokens", "20",
                     "--seed", "1", "--engine", engine, "--dtype", dtype, "--device", "cpu"]) == 0
        out, err = capsys.readouterr()
        # After the text, the bytes the cache allocated: it grows with the tokens up to the
        # context (here all 16 positions at once: the first chunk is 64; tests/inference/
        # test_kv_growth.py), 16 x 1,536 bytes in float32.
        held = "12.0 KiB" if (engine, dtype) == ("torch", "bfloat16") else "24.0 KiB"
        # (the first narrow NumPy model on a machine also says its kernels were compiled)
        model, cache, speed = [x for x in err.splitlines()
                               if not x.startswith("sheepop: kernels: ")]
        assert model == (f"sheepop: model: {n:,} parameters (3 layers, context 16), {kv_text}; "
                         f"{engine} engine, {dtype}")
        assert cache == (f"sheepop: KV cache: 16 of 16 positions allocated, {held} (peak "
                         f"{held}; the whole context: {held})")
        assert speed.startswith("sheepop: speed: prompt ")  # (tests/cli/test_cli_speed.py)
        assert out.startswith("the ") and len(out) > len("the \n")  # 20 tokens past context 16
