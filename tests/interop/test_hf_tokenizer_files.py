"""A Hugging Face directory's tokenizer (tokenizer.json + tokenizer_config.json) imported as the
pretrained kind and exported back: transformers' AutoTokenizer gives the same ids both ways."""

from __future__ import annotations

import json

from hf_vocabularies import BROAD_TEXT, sentencepiece_style
from tok_samples import PROSE

from sheepop.interop.hf_tokenizer import export_tokenizer, import_tokenizer
from sheepop.tokenizers import loads
from sheepop.tokenizers.chat_shipped import render_messages


def test_import_and_export_as_transformers_reads_them(tmp_path):
    from transformers import AutoTokenizer
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "tokenizer.json").write_text(sentencepiece_style([PROSE]).to_str(), encoding="utf-8")
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (src / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False,
                      "special": True},
        "unk_token": "<unk>", "add_eos_token": True,
        "add_bos_token": True, "chat_template": template}), encoding="utf-8")
    tok = import_tokenizer(src)
    assert tok.kind == "pretrained" and tok.chat_template == template
    assert (tok.bos_id, tok.eos_id, tok.unk_id) == (1, 2, 0)
    reference = AutoTokenizer.from_pretrained(src)
    text = BROAD_TEXT[:300]
    assert tok.encode_for_model(text) == reference(text)["input_ids"]
    # transformers 5 drops add_eos_token beside a tokenizer.json: its post-processor (BOS) rules
    assert tok.encode_for_model(text) == [1, *tok.encode(text)]
    assert export_tokenizer(loads(tok.to_json()), out, 64) == []
    again = AutoTokenizer.from_pretrained(out)
    assert again(text)["input_ids"] == reference(text)["input_ids"]
    assert import_tokenizer(out).to_json() == tok.to_json()


def test_chat_template_jinja_is_the_template_as_transformers_reads_it(tmp_path):
    """transformers 5 saves the template as chat_template.jinja (not in tokenizer_config.json),
    and that file wins over a template in tokenizer_config.json."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    saved = PreTrainedTokenizerFast(tokenizer_object=sentencepiece_style([PROSE]),
                                    bos_token="<s>", eos_token="</s>")
    saved.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    saved.save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").exists()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config,
                                                                "chat_template": "other"}))
    reference = AutoTokenizer.from_pretrained(tmp_path)
    tok = import_tokenizer(tmp_path)
    assert tok.chat_template == reference.chat_template == saved.chat_template
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert render_messages(tok, messages).text == reference.apply_chat_template(messages,
                                                                                tokenize=False)
