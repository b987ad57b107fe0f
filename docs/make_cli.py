"""Write docs/cli.md from the command line's own --help texts, so the page cannot drift.

    python docs/make_cli.py            # rewrite docs/cli.md
    python docs/make_cli.py --check    # exit 1 if docs/cli.md is out of date (used by a test)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PAGE = Path(__file__).with_name("cli.md")

INTRO = """# The command line

`sheepop COMMAND ...` (or `python -m sheepop COMMAND ...`). Every option is listed below with its
default, exactly as `--help` prints it (this page is generated from the parser by
`python docs/make_cli.py`, and a test fails when it is out of date).

A mistake in what you give (a missing path, a bad value, a corrupt checkpoint) prints one line,
`sheepop: error: ...`, and exits with status 2; nothing is half-written.

Configuration keys (`--set section.key=value`, or a TOML file with `[model]`, `[train]`, `[data]`,
`[sample]` tables given with `--config`) are applied in order: defaults, preset, file, `--set`,
then the flags that name a key (`--steps`). `sheepop train --help-config` prints every key with
the value that will apply, its meaning, and its default where the preset or a setting changed it
(below: a plain `sheepop train`, which starts from the `tiny` preset; add `--preset NAME`,
`--config`, `--set` or flags to see theirs). `sheepop train --print-config` prints the same
values as a TOML file that `--config FILE` reads back, and trains nothing:

```
{config}
```
"""


def subcommands(parser: argparse.ArgumentParser):
    """(name, parser) for every subcommand, nested ones included, in definition order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for child, subsub in subcommands(sub):
                    yield f"{name} {child}", subsub


def render() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal width
    from sheepop.cli import build_parser
    from sheepop.cli.common import DEFAULT_PRESET
    from sheepop.cli.show_config import describe_values
    from sheepop.config.build import build_config
    parser = build_parser()
    config = describe_values(build_config(DEFAULT_PRESET), f"the {DEFAULT_PRESET} preset")
    parts = [INTRO.replace("{config}", config), "## sheepop\n",
             f"```\n{parser.format_help().rstrip()}\n```\n"]
    for name, sub in subcommands(parser):
        parts.append(f"## sheepop {name}\n")
        parts.append(f"```\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print("docs/cli.md is out of date: run python docs/make_cli.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
