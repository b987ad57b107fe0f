"""A command-line mistake fails well: exit status 2, one `sheepop: error:` line, no traceback."""

from __future__ import annotations

from sheepop.cli import main


def fails(capsys, argv: list[str], *fragments: str) -> str:
    """Run `sheepop ARGV`; assert the refusal's shape (exit status 2; every line on stderr is
    sheepop's own, "sheepop: ...", the last of them the one error line; no traceback) and that
    the error line holds each fragment; return it. Lines before it are notes (the engine
    chosen, the model loaded)."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert lines and all(line.startswith("sheepop: ") for line in lines), err
    errors = [line for line in lines if line.startswith("sheepop: error:")]
    assert errors == lines[-1:] and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]
