"""The command line as a newcomer meets it (issue 19): a mistake in a subcommand's options gets
that subcommand's usage and the near match; help texts state each default once; a folder's
skipped files are said by reason and kind; counted words agree with their number; a run not on
a terminal is followed by plain lines and ends with the commands to go on; --show-probs says
what its list is; a resumed run keeps its model, in words."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re

import pytest

from sheepop.cli import build_parser, main
from sheepop.cli.common import flag_values

TINY = ["--no-progress", "--set", "model.n_layer=1", "--set", "model.n_head=1",
        "--set", "model.n_embd=16", "--set", "model.block_size=8", "--set", "train.batch_size=2",
        "--set", "train.eval_batches=1", "--set", "train.eval_interval=2",
        "--set", "train.log_interval=2", "--set", "train.threads=1", "--steps", "4"]
PAGE = ("<html><head><title>sheep</title><style>p {color: red}</style></head><body>"
        + "<p>the <b>quick</b> brown fox jumps over the lazy dog, and seven sheep sleep.</p>" * 30
        + "</body></html>")


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_subcommand_mistake_shows_its_usage_and_the_near_match(capsys):
    err = _usage_error(capsys, ["train", "--stesp", "5"])
    assert err.startswith("usage: sheepop train [-h]")
    assert err.rstrip().endswith("sheepop train: error: unrecognized argument: --stesp (did you "
                                 "mean --steps?)")
    err = _usage_error(capsys, ["progression", "train", "data", "--out", "r", "--windw-terms=4"])
    assert err.startswith("usage: sheepop progression train")
    assert "unrecognized argument: --windw-terms=4 (did you mean --window-terms?)" in err
    err = _usage_error(capsys, ["generate", "run", "--engine", "nmupy"])
    assert err.startswith("usage: sheepop generate") and "(did you mean numpy?)" in err
    err = _usage_error(capsys, ["trian"])
    assert err.startswith("usage: sheepop [-h]") and "(did you mean train?)" in err
    err = _usage_error(capsys, ["eval", "run", "--data", "x", "extra"])
    assert err.rstrip().endswith("sheepop eval: error: unrecognized argument: extra")


def _parsers(parser, name="sheepop"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_help_states_each_default_once_and_only_when_it_says_something(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option, to look at each alone
    parsers = dict(_parsers(build_parser()))
    assert {"sheepop train", "sheepop generate", "sheepop eval", "sheepop prepare",
            "sheepop tokenizer train", "sheepop progression train"} <= set(parsers)
    for name, parser in parsers.items():
        text = parser.format_help()
        for noise in ("(default: None)", "(default: none) (default", "(default: [])",
                      "(default: )", "(default: False)"):
            assert noise not in text, (name, noise)
        for line in text.splitlines():
            assert line.count("(default") <= 1, (name, line)
    generate = parsers["sheepop generate"].format_help()
    assert re.search(r"--max-new-tokens MAX_NEW_TOKENS\s+the most tokens to generate .*\(the "
                     r"run's sample.max_new_tokens; default 200\)", generate)
    assert re.search(r"--seed SEED\s+the seed of the sampling's random draws.*\(the run's "
                     r"sample.seed; default -1\)", generate)
    assert re.search(r"--batch-size BATCH_SIZE\s+windows per forward pass .*\(default: 16\)",
                     parsers["sheepop eval"].format_help())
    # One vocabulary (issue 32): an option that takes a number or a word shows its own name in
    # capitals, the same in every command (generate and chat share their sampling flags).
    for name, parser in parsers.items():
        for action in parser._actions:
            number = action.type in (int, float) or (action.type is None and action.nargs
                                                      is None and not action.choices)
            if action.option_strings and action.metavar and len(action.metavar) == 1:
                assert not number, (name, action.option_strings, action.metavar)
    chat = parsers["sheepop chat"].format_help()
    for flag in ("--max-new-tokens MAX_NEW_TOKENS", "--temperature TEMPERATURE",
                 "--top-k TOP_K", "--top-p TOP_P", "--min-p MIN_P", "--seed SEED",
                 "--repetition-penalty REPETITION_PENALTY"):
        assert flag in generate and flag in chat, flag


def test_the_tensorboard_switch_sets_its_key():
    parser = build_parser()
    assert flag_values(parser.parse_args(["train", "--tensorboard"])) == \
        {"train.tensorboard": True}
    assert flag_values(parser.parse_args(["train"])) == {}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`sheepop train FOLDER` on one HTML page and three files it cannot read, its standard
    error not a terminal: the folder, the run, and what it printed on stdout and stderr."""
    folder = tmp_path_factory.mktemp("notes")
    (folder / "page.html").write_text(PAGE)
    (folder / "backup.zip").write_bytes(b"PK\x03\x04" + bytes(60))
    (folder / "scan.png").write_bytes(b"\x89PNG\r\n\x1a\nxxxx")
    (folder / "paper.pdf").write_bytes(b"%PDF-1.4\nbroken")
    run = tmp_path_factory.mktemp("runs") / "notes"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["train", str(folder), "--out", str(run), *TINY]) == 0
    return folder, run, out.getvalue(), err.getvalue()


def test_train_on_a_folder_says_what_it_skipped_and_how_to_go_on(trained):
    folder, run, out, err = trained
    lines = out.splitlines()
    head = lines[0]
    assert head.startswith(f"data: read 1 file, 1 document, 0.00 MB from {folder}; skipped: ")
    skipped = sorted(head.split("; skipped: ")[1].split(", "))
    assert skipped == ["1 corrupt PDF (.pdf)", "1 corrupt image (.png)",
                       "1 unsupported type (.zip)"]
    assert lines[1] == (f"  to see each skipped file and why: sheepop prepare {folder} --out DIR "
                        "(its report and meta.json name them)")
    assert re.fullmatch(r"model: [\d,]+ parameters \(1 layer, 1 head, width 16, context 8\), .*",
                        lines[4])
    vocab = json.loads((run / "tokenizer.json").read_text())
    pieces = "".join(str(v) for v in vocab.values())
    assert "<" not in pieces.replace("<|", "") and "quick" not in pieces  # char: no tag left
    # not on a terminal (--no-progress too): plain lines on stderr, steps and evaluations
    progress = [line.split("  ")[0] for line in err.splitlines() if line.startswith("step ")]
    assert progress == ["step 2/4", "step 2/4", "step 4/4", "step 4/4"]
    assert "val loss" in err.splitlines()[-1]
    assert lines[-5:-2] == ["next:",
                            f"  sheepop generate {run} --prompt 'def '    # --best: the best "
                            "checkpoint",
                            f"  sheepop eval {run} --data FILE    # loss, perplexity, bits per "
                            "byte on any text"]
    assert lines[-2].startswith("  sheepop finetune --demo    # writes conversations to ")
    assert lines[-1].startswith(f"  sheepop finetune {run} --data "
                                f"runs/finetune-demo/data/train.jsonl --out {run}-chat")


def test_show_probs_names_the_distribution_and_words_agree_with_numbers(trained, capsys):
    folder, run, _, _ = trained
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "3",
                 "--temperature", "0", "--show-probs", "2"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"parameters \(1 layer, context 8\)", err)
    steps = out.splitlines()[1:]
    assert len(steps) == 3
    for line in steps:
        assert re.fullmatch(r"  -> '.+'   drawn from: '.+' \d\.\d{3}, '.+' \d\.\d{3}", line), line
    # greedy: the token drawn is the most likely of its distribution
    assert all(line.split("   drawn from: ")[1].startswith(line.split("   ")[0][5:])
               for line in steps)
    assert main(["eval", str(run), "--data", str(folder / "page.html"), "--max-windows",
                 "1"]) == 0
    assert re.match(r"8 tokens \(8 bytes\) in 1 window: loss ", capsys.readouterr().out)


def test_resume_with_another_model_size_is_said_in_layers(trained, capsys):
    _, run, _, _ = trained
    assert main(["train", "--resume", "--out", str(run), "--steps", "6",
                 "--set", "model.n_layer=2"]) == 2
    assert capsys.readouterr().err == (
        "sheepop: error: --resume: the run has 1 layer, the config asks for 2 (model.n_layer): "
        "a run keeps its model (start a new run with another --out to train a different one)\n")
    assert json.loads((run / "trainer.json").read_text())["step"] == 4
    assert os.path.isdir(run / "best")


def test_the_commands_to_go_on_quote_the_path_and_resume_an_interrupted_run():
    from sheepop.cli.train import next_commands
    assert next_commands("runs/my run", has_best=False, interrupted=True) == [
        "next:",
        "  sheepop train --resume --out 'runs/my run'    # continue it",
        "  sheepop generate 'runs/my run' --prompt 'def '",
        "  sheepop eval 'runs/my run' --data FILE    # loss, perplexity, bits per byte on any text",
        "  sheepop finetune --demo    # writes conversations to runs/finetune-demo/data/train.jsonl"
        ", fine-tunes a base model on them (about 25 min), then: sheepop chat "
        "runs/finetune-demo/full",
        "  sheepop finetune 'runs/my run' --data runs/finetune-demo/data/train.jsonl --out "
        "'runs/my run-chat'    # this run on them (or on your own, JSON Lines), then: sheepop "
        "chat 'runs/my run-chat'"]
