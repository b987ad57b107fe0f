"""`sheepop chat` end to end, on a tiny model whose tokenizer has the chat tokens: through a pipe
(one line per answer, each equal to sheepop's own greedy generation of the rendered
conversation), history, overflow, commands, Ctrl-C, and the refusal of a run without chat
tokens, in both engines."""

from __future__ import annotations

import io
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from cli_refusal import fails

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.cli.chat import Chat, escape, interactive, piped, unescape
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.generate import generate
from sheepop.generation.text_stream import stream_text
from sheepop.inference.load import load
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import IncrementalDecoder, train_tokenizer
from sheepop.tokenizers.chat_format import render_chat, with_chat_tokens
from sheepop.train.keeping import save_best
from sheepop.train.signals import Stopped

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py
MAX_NEW = 12
GREEDY = ["--temperature", "0", "--max-new-tokens", str(MAX_NEW)]


def weights(cfg: ModelConfig, end: int, seed: int = 7) -> dict[str, np.ndarray]:
    """Random weights, O(0.5), with the final norm's shift pointing at <|end|>'s head row: with
    this seed, some answers end on <|end|> after a token, others run to MAX_NEW line breaks."""
    rng = np.random.default_rng(seed)
    w = {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
             + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg).items()}
    row = w["head.weight"][end]
    w["ln_f.bias"] += (row / np.linalg.norm(row)).astype(np.float32)
    return w


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(a run whose tokenizer has the chat tokens, the same model without them)."""
    base = train_tokenizer("char", ["abc \n\\é"])
    tok, _ = with_chat_tokens(base)
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    w = weights(cfg.model, tok.special_tokens["<|end|>"])
    root = tmp_path_factory.mktemp("chat")
    checkpoint.save_checkpoint(root / "chat", w, cfg.to_dict(), tok.to_json())
    cfg.model.vocab_size = base.vocab_size
    plain = {k: v[:base.vocab_size] if k in ("tok_emb.weight", "head.weight") else v
             for k, v in w.items()}
    checkpoint.save_checkpoint(root / "plain", plain, cfg.to_dict(), base.to_json())
    return root / "chat", root / "plain"


def reference(model, conversation) -> str:
    """sheepop's own greedy answer to the rendered conversation: generation stops at <|end|>
    (or another special token, which no answer holds)."""
    tok = model.tokenizer
    ids = tok.encode(render_chat(conversation, add_generation_prompt=True))
    stops = [t for t in tok.special_tokens if t != "<|end|>"]
    return "".join(stream_text(model.lm, ids, SampleConfig(temperature=0, max_new_tokens=MAX_NEW),
                               IncrementalDecoder(tok), stop=stops,
                               eos_id=tok.special_tokens["<|end|>"]))


def say(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_pipe_one_line_per_answer_equal_to_greedy_generation(runs, engine):
    run = runs[0]
    lines = ["ab", "c", "/system c", "a b", "", "/reset", "ba", "/quit", "never read"]
    proc = subprocess.run([sys.executable, "-m", "sheepop", "chat", str(run), *GREEDY,
                           "--engine", engine, "--show-prompt"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    model = load(run, engine)
    expected, prompts, conversation, system = [], [], [], []
    for line in ["ab", "c", "/system c", "a b", "/reset", "ba"]:
        if line == "/system c":
            system = [say("system", "c")]
            continue
        if line == "/reset":
            conversation = []
            continue
        conversation.append(say("user", line))
        prompts.append(render_chat(system + conversation, add_generation_prompt=True))
        answer = reference(model, system + conversation)
        conversation.append(say("assistant", answer))
        expected.append(answer)
    assert expected[0] == "a" and expected[1] == "\n" * MAX_NEW  # <|end|> ends; the limit ends
    assert proc.stdout == "".join(escape(a) + "\n" for a in expected)
    assert len(proc.stdout.splitlines()) == 4  # one line per answer: "\n" written as \n
    shown = [line.split(": ", 2)[2] for line in proc.stderr.splitlines()
             if line.startswith("sheepop: prompt (")]
    assert shown == [escape(p) for p in prompts]
    assert "<|user|>\\nab<|end|>\\n<|assistant|>\\na<|end|>\\n<|user|>\\nc" in shown[1]
    assert "dropped" not in proc.stderr
    assert proc.stderr.splitlines()[0].startswith(f"sheepop: chat with {run} (")


def test_overflow_drops_the_oldest_turns_but_keeps_the_system_message(runs, monkeypatch,
                                                                      capsys):
    run = runs[0]
    turns = ["c", "ab", "a b", "cab"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(turns) + "\n"))
    assert main(["chat", str(run), *GREEDY, "--engine", "numpy", "--system", "b c",
                 "--show-prompt"]) == 0
    out, err = capsys.readouterr()
    model = load(run, "numpy")
    system = [say("system", "b c")]
    conversation, expected, prompts = [], [], []
    # The context is 64 tokens and 12 are kept for the answer: a prompt may take 52.
    for text in turns:
        conversation.append(say("user", text))
        while len(model.tokenizer.encode(render_chat(system + conversation, True))) > 52:
            del conversation[:2]  # the oldest turn: a user message and its answer
        prompts.append(render_chat(system + conversation, True))
        expected.append(reference(model, system + conversation))
        conversation.append(say("assistant", expected[-1]))
    assert out == "".join(escape(a) + "\n" for a in expected)
    shown = [line.split(": ", 2)[2] for line in err.splitlines()
             if line.startswith("sheepop: prompt (")]
    assert shown == [escape(p) for p in prompts]
    assert err.count("sheepop: dropped the oldest 2 messages to stay within the context") == 2
    assert all(p.startswith("<|system|>\nb c<|end|>\n") for p in prompts)
    assert "<|user|>\nc<|end|>" not in prompts[-1] and "<|user|>\ncab" in prompts[-1]


def test_a_run_without_chat_tokens_is_refused_in_one_line(runs, capsys):
    assert fails(capsys, ["chat", str(runs[1])]) == (
        "sheepop: error: this run's tokenizer has no chat template: fine-tune it with "
        "sheepop finetune first")


def test_escapes_round_trip():
    text = "a\\b\nc\r\\n é"
    assert escape(text) == "a\\\\b\\nc\\r\\\\n é"
    assert unescape(escape(text)) == text
    assert unescape("C:\\temp\\n") == "C:\\temp\n"  # only \\, \n and \r are escapes


@pytest.fixture
def chat(runs):
    model = load(runs[0], "numpy")
    return Chat(model, SampleConfig(temperature=0, max_new_tokens=MAX_NEW), "", False,
                io.StringIO())


def interrupted_stream(*args, **kwargs):
    """A stream that writes two pieces, then meets Ctrl-C."""
    yield "a"
    yield "\nb"
    raise KeyboardInterrupt


def test_ctrl_c_stops_the_answer_not_the_chat(chat, monkeypatch):
    monkeypatch.setattr("sheepop.generation.text_stream.stream_text", interrupted_stream)
    out = io.StringIO()
    piped(chat, io.StringIO("x\ny\n"), out)
    assert out.getvalue() == "a\\nb\na\\nb\n"
    assert chat.messages == [say("user", "x"), say("assistant", "a\nb"),
                             say("user", "y"), say("assistant", "a\nb")]
    assert chat.note.getvalue().count("sheepop: (answer stopped)") == 2

    def terminated(*args, **kwargs):
        yield "a"
        raise Stopped(signal.SIGTERM)

    monkeypatch.setattr("sheepop.generation.text_stream.stream_text", terminated)
    with pytest.raises(Stopped):  # SIGTERM still stops the command (exit 143 in main)
        piped(chat, io.StringIO("x\n"), io.StringIO())


class Keyboard:
    """A terminal's stdin: each item a line typed, or KeyboardInterrupt (Ctrl-C)."""

    def __init__(self, *events):
        self.events = list(events)

    def readline(self) -> str:
        event = self.events.pop(0) if self.events else ""
        if event is KeyboardInterrupt:
            raise KeyboardInterrupt
        return event


def test_at_the_prompt_ctrl_c_twice_or_end_of_input_leaves(chat):
    out, note = io.StringIO(), io.StringIO()
    interactive(chat, Keyboard(KeyboardInterrupt, "ab\n", KeyboardInterrupt,
                               KeyboardInterrupt, "never read\n"), out, note)
    assert out.getvalue() == "a\n"  # the answer, as written (not escaped) in a terminal
    assert note.getvalue().count("(Ctrl-C again, Ctrl-D or /quit to leave)") == 2
    assert note.getvalue().count("you> ") == 4
    out = io.StringIO()
    interactive(chat, Keyboard("/reset\n", "ab\n"), out, io.StringIO())  # then end of input
    assert out.getvalue() == "a\n" and chat.messages == [say("user", "ab"),
                                                          say("assistant", "a")]


def test_best_chats_with_the_runs_best_checkpoint(runs, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    cfg = Config.from_saved(checkpoint.load_config(run), "config")
    tok = checkpoint.load_tokenizer_json(run)
    other = weights(cfg.model, load(run, "numpy").tokenizer.special_tokens["<|end|>"], seed=8)
    save_best(run, other, cfg.to_dict(), tok, step=4, val_loss=0.5, val_bpb=None)
    conversation = [say("user", "ab")]
    want = reference(load(run / checkpoint.BEST_DIR, "numpy"), conversation)
    assert want != reference(load(run, "numpy"), conversation)  # the answer tells which one
    monkeypatch.setattr(sys, "stdin", io.StringIO("ab\n"))
    assert main(["chat", str(run), "--best", *GREEDY, "--engine", "numpy"]) == 0
    out, err = capsys.readouterr()
    assert out == escape(want) + "\n"
    assert "the best checkpoint of" in err and "step 4, val loss 0.5000" in err


def test_a_model_with_its_own_template_answers_through_it(tmp_path, monkeypatch, capsys):
    """A run whose tokenizer ships SmolLM2's ChatML template: the prompt is that template's
    text, each answer ends at <|im_end|> (never shown), as sheepop's own greedy generation."""
    from chatml import chatml_tokenizer
    tok = chatml_tokenizer()
    end = tok.special_tokens["<|im_end|>"]
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=192, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    checkpoint.save_checkpoint(tmp_path / "smol", weights(cfg.model, end, seed=5),
                               cfg.to_dict(), tok.to_json())
    model = load(tmp_path / "smol", "numpy")
    system = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
              "Hugging Face<|im_end|>\n")
    prompts, expected, text = [], [], system
    stops = ["<|endoftext|>", "<|im_start|>"]
    for user in ("The capital?", "of France"):
        text += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        prompts.append(text)
        cfg_sample = SampleConfig(temperature=0, max_new_tokens=MAX_NEW)
        answer = "".join(stream_text(model.lm, tok.encode(text), cfg_sample,
                                     IncrementalDecoder(tok), stop=stops, eos_id=end))
        expected.append(answer)
        text += f"{answer}<|im_end|>\n"
    first = [s.token for s in generate(model.lm, tok.encode(prompts[0]), cfg_sample,
                                       eos_id=end)]
    assert len(first) < MAX_NEW and first[-1] == end  # (this seed's first answer ends so)
    monkeypatch.setattr(sys, "stdin", io.StringIO("The capital?\nof France\n"))
    assert main(["chat", str(tmp_path / "smol"), *GREEDY, "--engine", "numpy",
                 "--show-prompt"]) == 0
    out, err = capsys.readouterr()
    assert out == "".join(escape(a) + "\n" for a in expected)
    assert "<|im_end|>" not in out
    shown = [line.split(": ", 2)[2] for line in err.splitlines()
             if line.startswith("sheepop: prompt (")]
    assert shown == [escape(p) for p in prompts]
