"""A Hugging Face directory's tokenizer (tokenizer.json + tokenizer_config.json) imported as the
pretrained kind and exported back: transformers' AutoTokenizer gives the same ids both ways."""

from __future__ import annotations

import json

from hf_vocabularies import BROAD_TEXT, sentencepiece_style
from tok_samples import PROSE

from sheepop.interop.hf_files import export_tokenizer, import_tokenizer
from sheepop.tokenizers import loads


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
