"""`sheepop prepare` on the command line: exit statuses, the summary, one-line errors."""

from __future__ import annotations

from sheepop.cli import main
from sheepop.data.shards import open_prepared


def test_prepare_command(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("some words\n")
    (tmp_path / "in" / "b.md").write_text("more words\n")
    (tmp_path / "in" / "c.txt").write_text("")
    out = tmp_path / "data"
    argv = ["prepare", str(tmp_path / "in"), "--out", str(out), "--workers", "1",
            "--tokenizer", "word", "--val-fraction", "0.5", "--exclude", "b.*", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "text          2       1        1" in printed
    assert "1  empty file" in printed and "1  excluded by --include/--exclude" in printed
    data = open_prepared(out)
    assert data.meta["tokenizer_kind"] == "word"
    assert data.tokenizer.decode(data.train.tolist()) == "some words\n<|eos|>"
    assert main(argv) == 2  # exists
    err = capsys.readouterr().err
    assert err == f"sheepop: error: output {out} already exists (use --overwrite to replace it)\n"
    assert main(argv + ["--overwrite"]) == 0


def test_nothing_usable_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "blank.txt").write_text("   \n")
    assert main(["prepare", str(tmp_path / "in"), "--out", str(tmp_path / "d")]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"sheepop: error: nothing usable found in {tmp_path / 'in'}: "
                            "1 file (1 no text)\n")
    assert "1  no text" in captured.out
    assert main(["prepare", str(tmp_path / "missing"), "--out", str(tmp_path / "d")]) == 2
    assert "input not found" in capsys.readouterr().err
