"""Bad input: one clear line on stderr, exit status 2, no traceback, nothing half-written."""

import subprocess
import sys

import pytest
from cli_refusal import fails

from sheepop.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    data = tmp_path_factory.mktemp("data") / "text.txt"
    data.write_text("hello world, hello sheep. " * 200)
    out = tmp_path_factory.mktemp("runs") / "run"
    code = main(["train", str(data), "--out", str(out), "--steps", "3", "--no-progress",
                 "--set", "model.n_layer=1", "--set", "model.n_embd=16",
                 "--set", "model.n_head=2", "--set", "model.block_size=16",
                 "--set", "train.batch_size=2"])
    assert code == 0
    assert (out / "loss.png").stat().st_size > 1000 and (out / "lr.png").stat().st_size > 1000
    return out


def test_missing_data(capsys, tmp_path):
    fails(capsys, ["train", str(tmp_path / "nope"), "--out", str(tmp_path / "r")],
          "data path not found")
    assert not (tmp_path / "r").exists()


def test_empty_data(capsys, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    fails(capsys, ["train", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "r")],
          "nothing usable found in", "1 file (1 empty file)")


def test_block_size_larger_than_data(capsys, tmp_path):
    (tmp_path / "small.txt").write_text("tiny text " * 3)
    fails(capsys, ["train", str(tmp_path / "small.txt"), "--out", str(tmp_path / "r"),
                   "--set", "model.block_size=64"], "block_size 64 is larger")
    assert not (tmp_path / "r" / "model.safetensors").exists()


def test_n_embd_not_divisible_by_n_head(capsys, tmp_path):
    fails(capsys, ["train", "--out", str(tmp_path / "r"), "--set", "model.n_embd=30",
                   "--set", "model.n_head=4"], "divisible")


def test_unknown_preset_and_config_key_and_bad_value(capsys, tmp_path):
    fails(capsys, ["train", "--preset", "huge", "--out", str(tmp_path / "r")], "unknown preset")
    fails(capsys, ["train", "--set", "model.n_layers=4"], "unknown config key", "n_layer")
    fails(capsys, ["train", "--set", "train.lr=fast"], "expects float")
    fails(capsys, ["train", "--set", "nolayer"], "section.key=value")


def test_bad_config_file(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nn_layer = 2")
    fails(capsys, ["train", "--config", str(bad)], "not valid TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[optim]\nlr = 1")
    fails(capsys, ["train", "--config", str(unknown)], "unknown config section 'optim'")


def test_existing_run_is_not_overwritten(capsys, run_dir):
    before = (run_dir / "model.safetensors").read_bytes()
    fails(capsys, ["train", "--out", str(run_dir)], "already holds a run")
    assert (run_dir / "model.safetensors").read_bytes() == before


def test_checkpoint_missing_files_and_corrupt(capsys, run_dir, tmp_path):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    (broken / "tokenizer.json").unlink()
    fails(capsys, ["generate", str(broken), "--prompt", "he"], "missing tokenizer.json")
    shutil.copy(run_dir / "tokenizer.json", broken)
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00garbage")
    fails(capsys, ["generate", str(broken), "--prompt", "he"], "not a valid safetensors")
    (broken / "config.json").write_text("{not json")
    fails(capsys, ["eval", str(broken), "--data", str(broken)], "not valid JSON")
    fails(capsys, ["generate", str(tmp_path / "absent")], "run directory not found")


def test_torn_checkpoint_is_refused_on_resume(capsys, run_dir, tmp_path):
    import shutil
    torn = tmp_path / "torn"
    shutil.copytree(run_dir, torn)
    data = bytearray((torn / "trainer.safetensors").read_bytes())
    data[-1] ^= 0xFF  # as if a crash left a file from another step
    (torn / "trainer.safetensors").write_bytes(bytes(data))
    fails(capsys, ["train", "--resume", "--out", str(torn)], "inconsistent")


def test_unknown_prompt_characters_warn_and_map_to_unk(capsys, run_dir):
    assert main(["generate", str(run_dir), "--prompt", "hé☃", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert ("warning: 2 characters of the prompt are not in the vocabulary, encoded as the "
            "unknown token (e.g. 'é' x1, '☃' x1)") in captured.err
    assert captured.out.startswith("hé☃")


def test_generate_and_eval_run(capsys, run_dir):
    assert main(["generate", str(run_dir), "--prompt", "hello", "--max-new-tokens", "5",
                 "--temperature", "0", "--show-probs", "2"]) == 0
    steps = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  -> ")]
    # five tokens, or fewer when the model ends the text with EOS
    assert len(steps) == 5 or (1 <= len(steps) < 5 and steps[-1].startswith("  -> '<|eos|>'"))
    assert all(line.count("drawn from:") == 1 and "<|pad|>" not in line for line in steps)
    assert main(["eval", str(run_dir), "--data", str(run_dir / "tokenizer.json")]) == 0
    assert "perplexity" in capsys.readouterr().out


def test_a_prompt_longer_than_the_context_is_said_to_be_cut(capsys, run_dir):
    prompt = "hello sheep, hello world. " * 3  # 75 characters, a context of 16
    assert main(["generate", str(run_dir), "--prompt", prompt, "--max-new-tokens", "2",
                 "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert "the prompt holds" in err and "more than the context (16): the model sees its " \
        "last 16" in err, err


@pytest.mark.parametrize("option", ["--max-windows", "--batch-size"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_eval_counts_below_one_are_refused(capsys, run_dir, option, value):
    """(A traceback each: NumPy could not stack no window, or sample -3; range() took no
    step of 0.)"""
    fails(capsys, ["eval", str(run_dir), "--data", str(run_dir / "tokenizer.json"), option,
                   value], f"{option} must be at least 1, not {value}")


def test_python_dash_m_entry_point_and_help():
    for argv in (["--help"], ["train", "--help"], ["generate", "--help"], ["eval", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "sheepop", *argv], capture_output=True,
                              text=True, check=True)
        assert "usage: sheepop" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "sheepop", "train", "--help"],
                          capture_output=True, text=True, check=True)
    assert "--resume" in proc.stdout and "default: runs/default" in proc.stdout


def test_resume_of_a_finished_run_asks_for_more_steps(capsys, run_dir):
    fails(capsys, ["train", "--resume", "--out", str(run_dir)], "already at step 3",
          "larger --steps")


def test_train_takes_a_tokenizer_kind(tmp_path):
    import json
    data = tmp_path / "t.txt"
    data.write_text("the cat sat on the mat. " * 300)
    assert main(["train", str(data), "--out", str(tmp_path / "r"), "--steps", "2",
                 "--tokenizer", "bpe", "--vocab-size", "300", "--no-progress",
                 "--set", "model.n_layer=1", "--set", "model.n_embd=16",
                 "--set", "model.block_size=8", "--set", "train.batch_size=2"]) == 0
    tok = json.loads((tmp_path / "r" / "tokenizer.json").read_text())
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert tok["kind"] == "bpe" and config["model"]["vocab_size"] <= 300
