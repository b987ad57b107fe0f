"""What a user of a real model expects to read (issue 41, section 4): `generate` says its speed on
stderr after the text, `chat --speed` after each answer (never on stdout, never on the answer's
line), Ctrl-C's note starts on a new line, and a chat whose weights overflow exits 2 as generate
does. The speed lines are read back by tests/helpers/speed_line.py: counts exact, rates the
quotients of the figures printed beside them, no timing bound."""

from __future__ import annotations

import io

import numpy as np
import pytest
from speed_line import check_speed

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.cli.chat import Chat, interactive
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.generate import generate
from sheepop.inference.load import load
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import END, render_chat, with_chat_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py
NEW = 12


def save_run(path, scale: float | None = None):
    """A tiny chat run: random weights O(0.5), or every value `scale` (3e38: finite on disk,
    infinite one matrix product later)."""
    tok, _ = with_chat_tokens(train_tokenizer("char", ["abc \n"]))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    rng = np.random.default_rng(3)
    w = {k: (rng.normal(size=s) * 0.5 + (1.0 if len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    if scale is not None:
        w = {k: np.full_like(v, scale) for k, v in w.items()}
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return save_run(tmp_path_factory.mktemp("speed") / "run")


def greedy_tokens(run, ids, end=None) -> int:
    """How many tokens sheepop's own greedy generation draws after `ids` (an end one counted)."""
    model = load(run, "numpy")
    cfg = SampleConfig(temperature=0, max_new_tokens=NEW)
    return sum(1 for _ in generate(model.lm, ids, cfg, eos_id=end))


@pytest.mark.parametrize("probs", [[], ["--show-probs", "2"]])
def test_generate_says_its_speed_on_stderr_after_the_text(run, capsys, probs):
    assert main(["generate", str(run), "--prompt", "abc ab", "--temperature", "0",
                 "--max-new-tokens", str(NEW), *probs]) == 0
    out, err = capsys.readouterr()
    assert "tokens/s" not in out  # stdout holds the text alone
    tok = load(run, "numpy").tokenizer
    ids = tok.encode("abc ab")
    check_speed(err.splitlines()[-1], prompt=len(ids), generated=greedy_tokens(run, ids,
                                                                               tok.eos_id))


def test_chat_says_each_answers_speed_with_speed_only(run, capsys, monkeypatch):
    for flag, answers in (([], 0), (["--speed"], 2)):
        monkeypatch.setattr("sys.stdin", io.StringIO("ab\nc\n"))
        assert main(["chat", str(run), "--temperature", "0", "--max-new-tokens", str(NEW),
                     *flag]) == 0
        out, err = capsys.readouterr()
        assert len(out.splitlines()) == 2 and "tokens/s" not in out
        lines = [line for line in err.splitlines() if "tokens/s" in line]
        assert len(lines) == answers
    tok = load(run, "numpy").tokenizer
    first = tok.encode(render_chat([{"role": "user", "content": "ab"}],
                                   add_generation_prompt=True))
    check_speed(lines[0], prompt=len(first),
                generated=greedy_tokens(run, first, tok.special_tokens[END]))


def interrupted_stream(*args, **kwargs):
    """A stream that writes a piece, then meets Ctrl-C."""
    yield "ab"
    raise KeyboardInterrupt


class Keyboard:
    """A terminal's stdin: one line typed, then Ctrl-D."""

    def __init__(self, line: str):
        self.lines = [line]

    def readline(self) -> str:
        return self.lines.pop(0) if self.lines else ""


def test_ctrl_c_says_so_on_a_new_line_after_the_answer(run, monkeypatch):
    monkeypatch.setattr("sheepop.generation.text_stream.stream_text", interrupted_stream)
    terminal = io.StringIO()  # stdout and stderr are one terminal
    chat = Chat(load(run, "numpy"), SampleConfig(temperature=0), "", False, terminal,
                show_speed=True)
    interactive(chat, Keyboard("ab\n"), terminal, terminal)
    shown = terminal.getvalue()
    assert "ab\nsheepop: (answer stopped)\nsheepop: speed: prompt " in shown, shown
    assert "ab" + "sheepop" not in shown


def test_chat_on_weights_that_overflow_exits_2_in_one_line(tmp_path, capsys, monkeypatch):
    huge = save_run(tmp_path / "huge", scale=3e38)
    monkeypatch.setattr("sys.stdin", io.StringIO("ab\nc\n"))
    assert main(["chat", str(huge), "--max-new-tokens", "3"]) == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "overflow" in errors[0] and "Traceback" not in err
