"""A command-line mistake fails well: exit status 2, one `sheepop: error:` line, no traceback."""

from __future__ import annotations

from sheepop.cli import main


def fails(capsys, argv: list[str], *fragments: str) -> str:
    """Run `sheepop ARGV`; assert the refusal's shape and that its line holds each fragment;
    return the line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("sheepop: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
