"""A Hugging Face directory's tokenizer files, both ways: tokenizer.json (and for a byte-level
BPE GPT-2's vocab.json + merges.txt) with tokenizer_config.json's special tokens and chat
template, or transformers 5's chat_template.jinja. The model's files are sheepop.interop.hf_files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sheepop.errors import UserError
from sheepop.files import read_json, read_text, shown
from sheepop.interop.hf_files import write_json
from sheepop.tokenizers import Tokenizer

TEMPLATE_FILE = "chat_template.jinja"  # transformers 5 saves the chat template here


def export_tokenizer(tok: Tokenizer, out_dir: Path, max_length: int) -> list[str]:
    """Write the tokenizer as tokenizer.json and tokenizer_config.json: a byte-level BPE also
    as GPT-2's vocab.json + merges.txt, a char or word tokenizer as the tokenizer.json of
    sheepop.tokenizers.hf (same ids), a pretrained tokenizer as its own tokenizer.json. Any
    other kind gets a note for the user instead."""
    from sheepop.tokenizers.hf import EXPORTED_KINDS, export_hf
    if tok.kind == "pretrained":
        return _export_pretrained(tok, out_dir, max_length)
    if tok.kind not in EXPORTED_KINDS:
        return [f"the run's tokenizer is '{tok.kind}', which has no Hugging Face form: wrote "
                f"the model only (encode text with sheepop, or train a bpe tokenizer)"]
    export_hf(tok, out_dir / "tokenizer.json")
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "model_max_length": max_length, "clean_up_tokenization_spaces": False}
    if tok.kind == "bpe":
        from sheepop.tokenizers.gpt2 import export_gpt2 as export_vocab_merges
        export_vocab_merges(tok, out_dir / "vocab.json", out_dir / "merges.txt")
        config.update(tokenizer_class="GPT2Tokenizer", add_prefix_space=False)
    write_json(out_dir / "tokenizer_config.json", {**config, **_special_names(tok)})
    return []


def _special_names(tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json's special tokens (and the chat template) of `tok`."""
    special = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "pad_token": tok.pad_id,
               "unk_token": tok.unk_id}
    config: dict[str, Any] = {k: tok.id_to_token(i) for k, i in special.items() if i is not None}
    # The other special tokens (the chat roles, <|end|>) are added tokens of tokenizer.json,
    # matched whole; listed here too, transformers also treats them as special (e.g. decoding
    # with skip_special_tokens drops them).
    named = {i for i in special.values() if i is not None}
    others = [t for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
              if i not in named]
    if others:
        config["additional_special_tokens"] = others
    if tok.chat_template is not None:  # the model's own, or sheepop.tokenizers.chat_format's
        config["chat_template"] = tok.chat_template
    return config


def _export_pretrained(tok: Any, out_dir: Path, max_length: int) -> list[str]:
    """A pretrained tokenizer's own tokenizer.json (its rule for adding BOS / EOS in the
    post-processor) and a tokenizer_config.json naming its special tokens, so transformers
    encodes as it does."""
    write_json(out_dir / "tokenizer.json", tok.to_hf_dict())
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "model_max_length": max_length,
                              "clean_up_tokenization_spaces": False, **_special_names(tok)}
    write_json(out_dir / "tokenizer_config.json", config)
    return []


def import_tokenizer(hf_dir: Path) -> Tokenizer:
    """The directory's tokenizer: its tokenizer.json read exactly (a "pretrained" tokenizer,
    with the special tokens, add_bos_token / add_eos_token and chat template of
    tokenizer_config.json), or else GPT-2's vocab.json + merges.txt (a bpe tokenizer). A
    tokenizer.json that sheepop exported from its own bpe kind comes back as that bpe kind.
    A chat_template.jinja file (where transformers 5 saves the template) is the chat template,
    over tokenizer_config.json's, as transformers reads it."""
    tj_path, config_path = hf_dir / "tokenizer.json", hf_dir / "tokenizer_config.json"
    config = read_json(config_path, what="tokenizer_config.json") if config_path.exists() \
        else None
    config = _with_template_file(hf_dir, config)
    if tj_path.exists():
        tj = read_json(tj_path, what="tokenizer.json")
        own = _sheepop_bpe(tj, tj_path, config)
        if own is not None:
            return own
        from sheepop.tokenizers.pretrained.hf_config import from_hf_files
        return from_hf_files(tj, config, str(tj_path), str(config_path))
    if (hf_dir / "vocab.json").exists() and (hf_dir / "merges.txt").exists():
        from sheepop.tokenizers.gpt2 import import_gpt2
        tok = import_gpt2(hf_dir / "vocab.json", hf_dir / "merges.txt")
        _sheepop_template(tok, config)
        return tok
    raise UserError(f"{hf_dir} has no tokenizer (tokenizer.json, or vocab.json + merges.txt)")


def _with_template_file(hf_dir: Path, config: Any) -> Any:
    """tokenizer_config.json's content with chat_template.jinja's text as its chat_template."""
    path = hf_dir / TEMPLATE_FILE
    if not path.exists():
        return config
    template = read_text(path, what="chat template")
    if config is not None and not isinstance(config, dict):
        return config  # the tokenizer's reader refuses it by name
    return {**(config or {}), "chat_template": template}


def _sheepop_template(tok: Tokenizer, config: Any) -> None:
    """sheepop's own chat template, when tokenizer_config.json holds exactly that one."""
    from sheepop.tokenizers.chat_format import CHAT_TEMPLATE
    if isinstance(config, dict) and config.get("chat_template") == CHAT_TEMPLATE:
        tok.chat_template = CHAT_TEMPLATE


def _sheepop_bpe(tj: Any, tj_path: Path, config: Any) -> Tokenizer | None:
    """A tokenizer.json of exactly the form sheepop.tokenizers.hf exports, read back as the
    bpe kind it came from (same ids, same file as before export); None for any other."""
    from sheepop.tokenizers.hf import to_hf_dict
    try:
        tok = _import_bpe(tj, tj_path)
        if to_hf_dict(tok) != tj:
            return None
    except UserError:
        return None
    _sheepop_template(tok, config)
    return tok


def _import_bpe(tj: Any, tj_path: Path) -> Tokenizer:
    from sheepop.tokenizers.gpt2 import check_vocab, from_gpt2, parse_merges
    model = tj.get("model") if isinstance(tj, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" \
            or not isinstance(model.get("vocab"), dict):
        raise UserError(f"{tj_path}: not a byte-level BPE tokenizer")
    merges = [_merge_line(m, tj_path) for m in _list(model.get("merges", []), "merges", tj_path)]
    added = [t for t in _list(tj.get("added_tokens", []), "added_tokens", tj_path)
             if isinstance(t, dict)]
    if not all(isinstance(t.get("content"), str) for t in added):
        raise UserError(f"{tj_path}: an added token has no string 'content'")
    vocab = {**model["vocab"], **{t["content"]: t.get("id") for t in added}}
    specials = [t["content"] for t in added if t.get("special")]
    where = str(tj_path)
    return from_gpt2(check_vocab(vocab, where), parse_merges("\n".join(merges), where),
                     specials, _split_pattern(tj) or "gpt2-exact", where, where)


def _list(value: Any, field: str, tj_path: Path) -> list[Any]:
    if not isinstance(value, list):
        raise UserError(f"{tj_path}: {field} is not a list")
    return value


def _merge_line(merge: Any, tj_path: Path) -> str:
    """One merge as merges.txt writes it: "a b" as it is, or the pair ["a", "b"] joined."""
    if isinstance(merge, str):
        return merge
    if isinstance(merge, list) and len(merge) == 2 and all(isinstance(m, str) for m in merge):
        return " ".join(merge)
    raise UserError(f"{tj_path}: a merge must be \"a b\" or [\"a\", \"b\"], not {shown(merge)}")


def _split_pattern(tj: dict[str, Any]) -> str | None:
    """The regex of a `Split` pre-tokenizer (as sheepop exports), or None (GPT-2's own)."""
    pre = tj.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "Split":
            pattern = step.get("pattern", {})
            if isinstance(pattern, dict) and "Regex" in pattern:
                return pattern["Regex"]
    return None
