"""Numbers out of a command's range: one `sheepop: error:` line naming the option and its limit,
exit status 2, never a traceback (NumPy's "high is out of bounds for int64") nor a silent exit 0
or a run far larger than the model it adapts."""

from __future__ import annotations

import json

import pytest
from cli_refusal import fails
from tiny_run import train_tiny_run

from sheepop.cli import main

GENERATE = ["progression", "generate", "--count", "5", "--ood-count", "5"]
INT64_NOTE = "below 2**63 (int64)"


@pytest.mark.parametrize("digits", [17, 18, 19, 30])
def test_progression_digits_leave_room_for_the_wider_ood_sets(capsys, tmp_path, digits):
    fails(capsys, [*GENERATE, "--out", str(tmp_path / "d"), "--digits", str(digits)],
          f"--digits {digits} is too large: at most 16", "--ood-more-digits (2)", INT64_NOTE)
    assert not (tmp_path / "d").exists()


def test_progression_digits_limit_follows_ood_more_digits(capsys, tmp_path):
    fails(capsys, [*GENERATE, "--out", str(tmp_path / "d"), "--digits", "15",
                   "--ood-more-digits", "4"], "--digits 15 is too large: at most 14")
    fails(capsys, [*GENERATE, "--out", str(tmp_path / "d"), "--ood-more-digits", "18"],
          "--ood-more-digits 18 is too large: at most 17")


@pytest.mark.parametrize("option, value", [("--first-max", 10**20),
                                           ("--max-difference", 10**19),
                                           ("--first-max", 10**16)])
def test_progression_ranges_fit_int64(capsys, tmp_path, option, value):
    fails(capsys, [*GENERATE, "--out", str(tmp_path / "d"), option, str(value)],
          f"{option} {value} is too large: at most 9999999999999999 (16 digits)", INT64_NOTE)


def test_progression_largest_term_fits_int64(capsys, tmp_path):
    """Each range within its limit, their largest term, first + difference (terms - 1), not."""
    fails(capsys, [*GENERATE, "--out", str(tmp_path / "d"), "--first-max", str(10**15),
                   "--max-difference", str(10**15)],
          "the largest term", f"= {10**15 + 99 * 10**15}, is too large", "9999999999999999")


def test_progression_widest_digits_still_generate(capsys, tmp_path):
    assert main([*GENERATE, "--out", str(tmp_path / "d"), "--digits", "16"]) == 0
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["digits"] == 16 and meta["sets"]["ood_digits_18"]["digits"] == 18


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A 1-layer model of width 16 (d_ff 64) and a few conversations to fine-tune it on."""
    root = tmp_path_factory.mktemp("lora")
    run = train_tiny_run(root, block_size=32)
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps({"prompt": f"say {n}", "completion": str(n)}) + "\n"
                             for n in range(8)))
    return run, chats


@pytest.mark.parametrize("rank, targets", [(17, "qkv,proj"), (100_000, "qkv,proj"),
                                           (17, "fc,down")])
@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_lora_rank_above_the_layers_width_is_refused(capsys, tmp_path, base_run, rank,
                                                     targets, engine, monkeypatch):
    """Refused before either engine builds an adapter (the torch engine's `add_lora` made
    parameters of that rank first: rank 10**6 on SmolLM2 would be tens of GB)."""
    from sheepop.train import engine_numpy, engine_torch

    def building(*args, **kwargs):
        raise AssertionError("adapters built before the rank was checked")

    monkeypatch.setattr(engine_torch, "add_lora", building)
    monkeypatch.setattr(engine_numpy, "LoraGPT", building)
    run, chats = base_run
    out = tmp_path / "out"
    fails(capsys, ["finetune", str(run), "--data", str(chats), "--out", str(out),
                   "--lora-rank", str(rank), "--lora-targets", targets, "--engine", engine],
          f"LoRA rank {rank} is above 16", "smallest min(d_in, d_out)", "full fine-tuning")
    assert not out.exists()


def test_tokenizer_info_refuses_a_negative_show(capsys, base_run):
    run, _ = base_run
    fails(capsys, ["tokenizer", "info", str(run / "tokenizer.json"), "--show", "-1"],
          "--show must be >= 0", "not -1")
    assert main(["tokenizer", "info", str(run / "tokenizer.json"), "--show", "0"]) == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-nan", "1e400"])
def test_prepare_refuses_a_sample_size_that_is_not_a_finite_number(capsys, tmp_path, value):
    (tmp_path / "text.txt").write_text("hello sheep. " * 20)
    out = tmp_path / "data"
    fails(capsys, ["prepare", str(tmp_path / "text.txt"), "--out", str(out),
                   f"--tokenizer-sample-mb={value}"],
          "--tokenizer-sample-mb must be a finite number >= 0")
    assert not out.exists()
