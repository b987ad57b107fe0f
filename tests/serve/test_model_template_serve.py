"""`sheepop serve` on a run whose tokenizer ships its own chat template (SmolLM2's ChatML, on a
small bpe): /v1/chat/completions through the `openai` client answers through that template and
ends at <|im_end|>, as sheepop's own generation does; the page's chat view (/v1/inspect) reads
the same prompt ids; a template's refusal is a 400."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from chatml import chatml_tokenizer
from openai import BadRequestError, OpenAI
from serve_helpers import ServerProcess, call, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.text_stream import stream_text
from sheepop.inference.load import load
from sheepop.tokenizers import IncrementalDecoder
from sheepop.tokenizers.chat_format import chat_ids

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"}]
REFUSING = ("{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ raise_exception('no system messages here') }}{% endif %}"
            "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
            "{% endif %}")


@pytest.fixture(scope="module")
def smol_runs(tmp_path_factory):
    """(a run with SmolLM2's template, one whose template refuses system messages)."""
    root = tmp_path_factory.mktemp("smol-serve")
    out = []
    for name, template in (("smol", None), ("refusing", REFUSING)):
        tok = chatml_tokenizer() if template is None else chatml_tokenizer(template)
        cfg = Config()
        cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=160, n_layer=2,
                                n_head=2, n_embd=32, tie_weights=False)
        w = weights(cfg.model, seed=5)
        row = w["head.weight"][tok.special_tokens["<|im_end|>"]]  # the final norm's shift
        w["ln_f.bias"] += (2 * row / np.linalg.norm(row)).astype(np.float32)  # leans to it
        checkpoint.save_checkpoint(root / name, w, cfg.to_dict(), tok.to_json())
        out.append(root / name)
    return out


@pytest.fixture(scope="module")
def smol_server(smol_runs):
    s = ServerProcess(smol_runs[0], "--engine", "numpy")
    yield s
    assert s.stop(signal.SIGTERM) == 0


def test_a_chat_completion_answers_through_the_models_template(smol_server, smol_runs):
    model = load(smol_runs[0], "numpy")
    tok = model.tokenizer
    client = OpenAI(base_url=smol_server.url + "/v1", api_key="none", max_retries=0,
                    timeout=120)
    ids, _ = chat_ids(tok, MESSAGES, add_generation_prompt=True)
    assert tok.decode(ids) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                               "What is the capital of France?<|im_end|>\n"
                               "<|im_start|>assistant\n")
    end = tok.special_tokens["<|im_end|>"]
    for max_tokens in (40, 3):
        r = client.chat.completions.create(model="smol", messages=MESSAGES,
                                           max_tokens=max_tokens, temperature=0)
        cfg = SampleConfig(temperature=0, max_new_tokens=max_tokens)
        expected = "".join(stream_text(model.lm, ids, cfg, IncrementalDecoder(tok),
                                       stop=["<|endoftext|>", "<|im_start|>"], eos_id=end))
        assert r.choices[0].message.content == expected
        assert "<|im_end|>" not in expected and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].finish_reason == "length"
    # (with 40 tokens, this seed's model ends its answer on <|im_end|>: 4 tokens, then it)
    long = client.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=40,
                                          temperature=0)
    assert long.choices[0].finish_reason == "stop" and long.usage.completion_tokens == 5


def test_the_pages_chat_view_reads_the_templates_prompt(smol_server, smol_runs):
    tok = load(smol_runs[0], "numpy").tokenizer
    shape = call(smol_server.url, "GET", "/v1/inspect").json()
    assert shape["chat"] is True
    r = call(smol_server.url, "POST", "/v1/inspect", {"messages": MESSAGES, "top": 2,
                                                      "layers": [0]})
    assert r.status == 200, r.text
    ids, _ = chat_ids(tok, MESSAGES, add_generation_prompt=True)
    assert [t["id"] for t in r.json()["tokens"]] == ids


def test_a_templates_refusal_is_a_400_naming_it(smol_runs):
    server = ServerProcess(smol_runs[1], "--engine", "numpy")
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(BadRequestError) as e:
            client.chat.completions.create(model="refusing", messages=MESSAGES, max_tokens=2)
        assert e.value.body["message"] == ("the chat template refused the conversation: no "
                                           "system messages here")
        assert e.value.body["param"] == "messages"
        ok = client.chat.completions.create(model="refusing", messages=MESSAGES[1:],
                                            max_tokens=2, temperature=0)
        assert ok.choices[0].message.role == "assistant"
    finally:
        assert server.stop(signal.SIGTERM) == 0
