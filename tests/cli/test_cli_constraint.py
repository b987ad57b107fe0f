"""`sheepop generate` and `sheepop chat` with --json-schema FILE, --json-object and --regex: every
output has the shape asked (a random tiny model, hot, whose free text is noise), and a bad
schema file or a keyword that cannot be enforced is one `sheepop: error:` line, exit 2."""

from __future__ import annotations

import io
import json
import re
import sys

import jsonschema
import numpy as np
import pytest
from cli_refusal import fails

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.schema import Config, ModelConfig
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer
from sheepop.tokenizers.chat_format import with_chat_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py
SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99},
    "tag": {"enum": ["red", "blue"]},
    "code": {"type": "string", "pattern": "^[a-f]{2,4}$"}},
    "required": ["id", "tag", "code"], "additionalProperties": False}
HOT = ["--temperature", "1.5", "--max-new-tokens", "200", "--engine", "numpy"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny model whose tokenizer has the chat tokens and every character of JSON."""
    tok, _ = with_chat_tokens(train_tokenizer("char", ['{}[]":, 0123456789 abcdefghijklmnop'
                                                       'qrstuvwxyz-.\n']))
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=256, n_layer=1, n_head=2,
                            n_embd=32, tie_weights=False)
    rng = np.random.default_rng(5)
    w = {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
             + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    path = tmp_path_factory.mktemp("constraint") / "run"
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path


@pytest.fixture
def schema_file(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return path


def generated(capsys, *argv: str) -> str:
    assert main(["generate", *argv]) == 0
    return capsys.readouterr().out


def test_generate_writes_json_of_the_schema_for_every_seed(run, schema_file, capsys):
    for seed in range(4):
        out = generated(capsys, str(run), "--prompt", "ab", "--json-schema", str(schema_file),
                        "--seed", str(seed), *HOT)
        assert out.startswith("ab") and out.endswith("\n")
        jsonschema.validate(json.loads(out[2:-1]), SCHEMA)
    free = generated(capsys, str(run), "--prompt", "ab", "--seed", "0", *HOT)
    with pytest.raises(ValueError):  # the model alone writes no JSON
        json.loads(free[2:-1])


def test_generate_matches_a_regex_whole(run, capsys):
    for seed in range(4):
        out = generated(capsys, str(run), "--prompt", "x", "--regex", "[0-9]{3}-[a-z]+",
                        "--seed", str(seed), *HOT)
        assert re.fullmatch("[0-9]{3}-[a-z]+", out[1:-1]), out


def test_chat_answers_each_turn_with_a_json_object(run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\nmore\nagain\n"))
    assert main(["chat", str(run), "--json-object", "--seed", "3", *HOT]) == 0
    answers = capsys.readouterr().out.splitlines()
    assert len(answers) == 3
    for line in answers:  # (one line per answer: a line break is written \n)
        assert isinstance(json.loads(line.replace("\\n", "\n").replace("\\\\", "\\")), dict)


def test_bad_shapes_are_one_line_and_exit_2(run, tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text('{"type": "object",')
    fails(capsys, ["generate", str(run), "--json-schema", str(broken)], "broken.json",
          "not valid JSON")
    fails(capsys, ["generate", str(run), "--json-schema", str(tmp_path / "none.json")],
          "--json-schema", "no such file")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    fails(capsys, ["generate", str(run), "--json-schema", str(listed)], "a JSON schema is a "
          "JSON object")
    unique = tmp_path / "unique.json"
    unique.write_text(json.dumps({"type": "array", "uniqueItems": True}))
    for command in ("generate", "chat"):
        fails(capsys, [command, str(run), "--engine", "numpy", "--json-schema", str(unique)],
              "cannot be enforced", "uniqueItems")
    fails(capsys, ["chat", str(run), "--engine", "numpy", "--regex", "(ab"], "cannot be enforced")
