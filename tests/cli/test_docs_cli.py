import subprocess
import sys
from pathlib import Path

from doc_blocks import page_blocks

ROOT = Path(__file__).resolve().parents[2]


def test_cli_page_is_generated_from_the_current_parser():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "make_cli.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_readme_holds_exactly_the_two_setup_commands():
    block = page_blocks(ROOT / "README.md")[0].text  # the first, under "## Set up"
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make run", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
