"""benchmarks/architectures.py's own arithmetic (the benchmark itself runs for an hour and prints
its figures for docs/): the chunks of the round-robin, the training time read back from the
chunks' metrics, the table, and that each ablation changes `tiny` in exactly its component."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from variants import RMSNORM, ROPE, SWIGLU, llama

from sheepop.config.build import build_config

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "architectures.py"
sys.path.insert(0, str(SCRIPT.parent))  # architectures imports machine as a sibling
spec = importlib.util.spec_from_file_location("architectures_benchmark", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_chunks_end_at_the_total_and_each_holds_at_least_one_step():
    assert bench.chunk_ends(10, 3) == [3, 6, 10]
    assert bench.chunk_ends(4, 4) == [1, 2, 3, 4]
    assert bench.chunk_ends(4321, 10) == [432, 864, 1296, 1728, 2160, 2592, 3024, 3456, 3888,
                                          4321]
    for steps in range(7, 40):
        ends = bench.chunk_ends(steps, 7)
        assert ends[-1] == steps and all(b > a for a, b in zip([0] + ends, ends))


def test_training_seconds_are_the_chunks_steps_over_their_rates(tmp_path):
    rows = [{"step": s, "loss": 3.0, "tokens_per_sec": 1.0} for s in range(1, 11)]
    rows[3] = {"step": 4, "loss": 3.0, "tokens_per_sec": 1024.0, "val_loss": 2.5, "val_bpb": 3.6}
    rows[9] = {"step": 10, "loss": 2.0, "tokens_per_sec": 2048.0, "val_loss": 2.25,
               "val_bpb": 3.25}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = {"changes": "x", "params": 100, "kv_bytes": 4096, "steps": 10, "ends": [4, 10],
            "probe_s": 0.5, "tokens_per_step": 2048}
    r = bench.result("gpt", plan, tmp_path, wall=30.0)
    # 4 steps x 2048 tokens at 1024 tokens/s = 8 s, then 6 x 2048 at 2048 tokens/s = 6 s
    assert r["train_seconds"] == 14.0
    assert r["tokens_per_sec"] == round(10 * 2048 / 14)  # 1463
    assert (r["val_loss"], r["val_bpb"], r["probe_ms_per_step"]) == (2.25, 3.25, 500.0)
    assert r["curve"] == [{"step": 4, "train_seconds": 8.0, "val_loss": 2.5, "val_bpb": 3.6},
                          {"step": 10, "train_seconds": 14.0, "val_loss": 2.25,
                           "val_bpb": 3.25}]


def test_the_table_gives_each_contender_its_difference_from_gpt():
    base = {"name": "gpt", "changes": "the `tiny` preset", "params": 815488,
            "kv_bytes_per_token": 4096, "steps": 4000, "train_seconds": 600.2,
            "tokens_per_sec": 13648, "val_loss": 1.1, "val_bpb": 1.6}
    gqa = {**base, "name": "gpt+gqa", "changes": "2 key/value heads of 4",
           "kv_bytes_per_token": 2048, "val_bpb": 1.5875}
    lines = bench.table([base, gqa]).splitlines()
    assert lines[2] == ("| gpt | the `tiny` preset | 815,488 | 4,096 | 4,000 | 600 | 13,648 | "
                        "1.1000 | 1.6000 |  |")
    assert lines[3].endswith("| 2,048 | 4,000 | 600 | 13,648 | 1.1000 | 1.5875 | -0.0125 |")


def test_each_ablation_changes_tiny_in_its_component_only():
    tiny = build_config("tiny", None, []).to_dict()["model"]

    def changed(preset, overrides):
        model = build_config(preset, None, overrides).to_dict()["model"]
        return {k: v for k, v in model.items() if tiny[k] != v}

    found = {name: changed(preset, ov) for name, preset, ov, _ in bench.CONTENDERS}
    assert found == {
        "gpt": {}, "gpt+rope": ROPE, "gpt+rmsnorm": RMSNORM,
        "gpt+swiglu": {**SWIGLU, "d_ff": 384}, "gpt+gqa": {"n_kv_head": 2},
        "llama": llama(n_kv_head=2, d_ff=384)}
