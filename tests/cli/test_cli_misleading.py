"""Commands that used to succeed and mislead (issue 32): each now refuses in one line with the
command meant, or warns on stderr, through the command line itself."""

from __future__ import annotations

import json
import math
import re

import pytest
from cli_refusal import fails

from sheepop.cli import main

TINY = ["--no-progress", "--set", "model.n_layer=1", "--set", "model.n_head=1",
        "--set", "model.n_embd=16", "--set", "model.block_size=8", "--set", "train.batch_size=2",
        "--set", "train.eval_batches=1", "--set", "train.eval_interval=2",
        "--set", "train.log_interval=2", "--set", "train.threads=1"]
TEXT = "the quick brown fox jumps over the lazy dog, and seven sheep sleep. " * 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A two-step run on plain English text (char tokenizer), its text beside it."""
    root = tmp_path_factory.mktemp("trained")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    run = root / "run"
    assert main(["train", str(root / "text.txt"), "--out", str(run), *TINY, "--steps", "2",
                 "--set", "train.warmup_steps=1"]) == 0
    return run


def test_a_run_directory_as_data_is_refused_with_the_commands_meant(trained, capsys, tmp_path):
    out = tmp_path / "new"
    line = fails(capsys, ["train", str(trained), "--steps", "20", "--out", str(out)],
                 f"DATA {trained} is a run directory",
                 f"sheepop train --resume --out {trained}",
                 f"--init-from {trained} --out NEW_RUN")
    assert "not text to train on" in line
    assert not out.exists()
    fails(capsys, ["train", str(trained / "best"), "--out", str(out)], "--init-from")


def test_steps_within_the_warmup_warn_that_the_rate_never_decays(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert main(["train", str(text), "--out", str(tmp_path / "a"), *TINY, "--steps", "4",
                 "--set", "train.warmup_steps=10"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["sheepop: warning: train.steps (4) is not above train.warmup_steps (10): "
                        "the learning rate only warms up, to 40% of train.lr, and never decays "
                        "(lower it: --set train.warmup_steps=N)"]
    assert main(["train", str(text), "--out", str(tmp_path / "b"), *TINY, "--steps", "4",
                 "--set", "train.warmup_steps=3"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("name, content, reason", [
    ("chats.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n',
     "(1 no documents; lines/rows: 1 no field 'text')"),
    ("blob.bin", bytes(range(256)) * 4, "(1 unsupported type)"),
])
def test_no_usable_text_says_why_in_prepare_train_and_eval(trained, capsys, tmp_path, name,
                                                          content, reason):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    expected = f"nothing usable found in {path}: 1 file {reason}"
    for argv in (["prepare", str(path), "--out", str(tmp_path / "p")],
                 ["train", str(path), "--out", str(tmp_path / "r")],
                 ["eval", str(trained), "--data", str(path)]):
        assert fails(capsys, argv) == f"sheepop: error: {expected}"
    assert not (tmp_path / "p").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("item, meant", [("model.n_layers=2", "model.n_layer"),
                                         ("train.step=3", "train.steps"),
                                         ("train.block_size=8", "model.block_size"),
                                         ("modle.n_layer=2", "model.n_layer")])
def test_a_misspelt_config_key_gets_the_near_match(capsys, tmp_path, item, meant):
    fails(capsys, ["train", "--set", item, "--out", str(tmp_path / "r")],
          f"(did you mean {meant}?)")
    assert not (tmp_path / "r").exists()


def test_help_config_shows_the_values_that_apply(capsys):
    assert main(["train", "--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = next(line for line in lines if line.startswith("  train.steps = "))
    assert steps == ("  train.steps = 1500    # optimizer steps (default 1000; set by the tiny "
                     "preset)")
    assert "  train.lr = 0.002    # peak learning rate (default 0.001; set by the tiny preset)" \
        in lines
    assert any(line.startswith("  train.eval_interval = 250    #") for line in lines)
    assert main(["train", "--help-config", "--preset", "baby", "--steps", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("  train.steps = 7    # optimizer steps (default 1000; set by the baby preset, the "
            "flags)") in lines
    assert any(line.startswith("  model.n_embd = 384    #") for line in lines)


def test_print_config_prints_the_resolved_config_as_toml_and_trains_nothing(capsys, tmp_path):
    import tomllib
    out = tmp_path / "r"
    argv = ["train", "--print-config", "--preset", "baby", "--steps", "7",
            "--set", "model.n_layer=2", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    printed = tomllib.loads(text)
    assert set(printed) == {"model", "train", "data", "sample"}
    assert (printed["train"]["steps"], printed["model"]["n_layer"],
            printed["model"]["n_embd"], printed["train"]["lr"]) == (7, 2, 384, 1e-3)
    assert not out.exists()
    (tmp_path / "c.toml").write_text(text, encoding="utf-8")
    assert main(["train", "--print-config", "--config", str(tmp_path / "c.toml")]) == 0
    assert capsys.readouterr().out == text  # --config reads it back to the same config


def test_train_help_states_the_defaults_that_apply(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "optimizer steps (train.steps; default: 1500 with the tiny preset)" in out
    assert "(train.seed; default: 1337)" in out


GPT2_SHAPED = ["--set", "model.pos_encoding=learned", "--set", "model.activation=gelu_tanh"]


def test_export_into_a_model_directory_needs_overwrite_and_leaves_no_stale_file(
        trained, capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    runs = {}
    for kind in ("bpe", "char"):
        runs[kind] = tmp_path / kind
        assert main(["train", str(text), "--out", str(runs[kind]), *TINY, *GPT2_SHAPED,
                     "--steps", "1", "--set", "train.warmup_steps=1", "--tokenizer", kind,
                     "--vocab-size", "300" if kind == "bpe" else "0"]) == 0
    alone = tmp_path / "alone"
    assert main(["export", str(runs["char"]), str(alone), "--to", "hf-gpt2"]) == 0
    out = tmp_path / "out"
    assert main(["export", str(runs["bpe"]), str(out), "--to", "hf-gpt2"]) == 0
    bpe_files = {p.name for p in out.iterdir()}
    assert {"merges.txt", "vocab.json"} <= bpe_files
    capsys.readouterr()
    fails(capsys, ["export", str(runs["char"]), str(out), "--to", "hf-gpt2"],
          f"{out} is not empty (it holds config.json, generation_config.json", "--overwrite")
    assert {p.name for p in out.iterdir()} == bpe_files  # untouched
    assert main(["export", str(runs["char"]), str(out), "--to", "hf-gpt2", "--overwrite"]) == 0
    assert {p.name for p in out.iterdir()} == {p.name for p in alone.iterdir()}
    assert (out / "model.safetensors").read_bytes() == (alone / "model.safetensors").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing set aside
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    fails(capsys, ["export", str(runs["char"]), str(folder), "--to", "hf-gpt2", "--overwrite"],
          f"refusing to overwrite {folder}: it holds no model")
    assert (folder / "notes.txt").read_text() == "mine"
    # The same for the one file of a GGUF export: --overwrite replaces a GGUF file only.
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    fails(capsys, ["export", str(runs["char"]), str(notes), "--to", "gguf", "--overwrite"],
          f"refusing to overwrite {notes}: it is not a GGUF file")
    assert notes.read_text() == "mine"


def test_a_failed_overwrite_puts_the_old_export_back(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "tokenizer.json").write_text("{}")
    # a run that is not there: refused after the old export was moved aside
    assert main(["export", str(tmp_path / "missing"), str(out), "--to", "hf-gpt2",
                 "--overwrite"]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "tokenizer.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_import_into_a_run_names_overwrite(trained, capsys, tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    fails(capsys, ["import", str(tmp_path / "x.gguf"), str(trained)],
          f"{trained} already holds a run (use --overwrite to replace it")


def _eval_json(capsys, run, data) -> tuple[dict, list[str]]:
    assert main(["eval", str(run), "--data", str(data), "--json", "--engine", "numpy"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), [line for line in captured.err.splitlines()
                                      if "warning" in line]


def test_eval_on_text_the_tokenizer_lacks_counts_its_real_bytes_and_warns(trained, capsys,
                                                                          tmp_path):
    cjk = "羊在山上睡觉。" * 300  # no character of it is in the English run's vocabulary
    (tmp_path / "cjk.txt").write_text(cjk, encoding="utf-8")
    figures, warnings = _eval_json(capsys, trained, tmp_path / "cjk.txt")
    assert figures["tokens"] == len(cjk)  # every character a target (EOS follows the last)
    # every byte of the text: the first character is no target, but as an <|unk|> it writes
    # nothing itself, so its bytes are among those spread over the targets
    assert figures["bytes"] == len(cjk.encode("utf-8")) == 3 * len(cjk)
    assert figures["bits_per_byte"] == pytest.approx(
        figures["loss"] * figures["tokens"] / (math.log(2) * figures["bytes"]), rel=1e-12)
    assert figures["bits_per_byte"] < 8 * figures["loss"]  # not thousands of bits per byte
    assert warnings == ["sheepop: warning: 2,100 characters of the data are not in the "
                        "vocabulary, encoded as the unknown token (e.g. '羊' x300, '在' x300, "
                        "'山' x300, '上' x300, '睡' x300, ...)"]


def test_eval_counts_the_bytes_of_unknown_characters_among_known_ones(trained, capsys,
                                                                      tmp_path):
    text = TEXT.replace("sheep", "shéép ☃")
    (tmp_path / "mixed.txt").write_text(text, encoding="utf-8")
    figures, warnings = _eval_json(capsys, trained, tmp_path / "mixed.txt")
    # all but the first character's byte ('t': a target of nothing)
    assert figures["bytes"] == len(text.encode("utf-8")) - 1
    assert warnings == ["sheepop: warning: 120 characters of the data are not in the "
                        "vocabulary, encoded as the unknown token (e.g. 'é' x80, '☃' x40)"]
    (tmp_path / "plain.txt").write_text(TEXT, encoding="utf-8")
    figures, warnings = _eval_json(capsys, trained, tmp_path / "plain.txt")
    assert figures["bytes"] == len(TEXT) - 1 and warnings == []


def test_resume_on_new_text_warns_about_what_the_tokenizer_lacks(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    common = [*TINY, "--set", "train.warmup_steps=1"]
    assert main(["train", str(text), "--out", str(run), *common, "--steps", "1"]) == 0
    capsys.readouterr()
    other = tmp_path / "other.txt"
    other.write_text(TEXT.upper(), encoding="utf-8")
    assert main(["train", str(other), "--resume", "--out", str(run), *common,
                 "--steps", "2"]) == 0
    out = capsys.readouterr().out
    n = sum(c.isalpha() for c in TEXT)  # the capitals: not one is in the lowercase vocabulary
    assert (f"warning: {n:,} characters of the data are not in the vocabulary, encoded as the "
            "unknown token (e.g. 'E' x") in out
    # Its val bits per byte are over the real text: the unknown capitals' bytes count (all
    # ASCII, one token each, so bits per byte is near the loss in bits: the lost bytes are
    # spread over 16 targets by the text's average; counting only the bytes the tokens
    # write, the non-letters, it was about 5 times that).
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if "val_bpb" in line][-1]
    assert last["val_bpb"] == pytest.approx(last["val_loss"] / math.log(2), rel=0.15)


def test_a_run_bounded_by_time_shows_its_budget_not_a_step_ceiling(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert main(["train", str(text), "--out", str(tmp_path / "r"), *TINY, "--steps", "100000",
                 "--set", "train.max_minutes=0.04", "--set", "train.log_interval=1",
                 "--set", "train.eval_interval=0", "--set", "train.checkpoint_interval=0"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert lines and not any("/100000" in line for line in lines[1:])
    assert all(re.match(r"step \d+ \(\ds of a 2s budget\)  (val )?loss ", line)
               for line in lines[1:])


def test_finetune_without_out_writes_beside_its_base_and_never_over_a_run(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    base = tmp_path / "base"
    assert main(["train", str(text), "--out", str(base), *TINY, "--steps", "1",
                 "--set", "train.warmup_steps=1", "--set", "model.block_size=64"]) == 0
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"the {w} fox"}, {"role": "assistant", "content": w}]}) + "\n"
        for w in ("quick", "brown", "lazy", "seven")), encoding="utf-8")
    argv = ["finetune", str(base), "--data", str(chats), "--steps", "1", "--no-progress",
            "--threads", "1", "--set", "train.batch_size=2"]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fine-tuning into {base}-chat (--out: another directory)\n")
    assert (tmp_path / "base-chat" / "model.safetensors").is_file()
    before = (tmp_path / "base-chat" / "model.safetensors").read_bytes()
    fails(capsys, argv, f"{base}-chat already holds a run: continue it with --resume")
    assert (tmp_path / "base-chat" / "model.safetensors").read_bytes() == before
    fails(capsys, ["finetune", "--resume"], "--resume needs --out RUN_DIR")


def test_help_config_of_a_resumed_run_shows_the_runs_values(trained, capsys):
    assert main(["train", "--help-config", "--resume", "--out", str(trained)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  train.steps = 2    # optimizer steps (default 1000; set by the run)" in lines
    assert any(line.startswith("  model.n_embd = 16    #") for line in lines)
