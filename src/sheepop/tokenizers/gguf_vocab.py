"""GGUF vocabularies: a tokenizer from a GGUF file's `tokenizer.ggml.*` metadata, and back.

A GGUF file has no tokenizer.json: llama.cpp keeps the vocabulary as metadata (tokens in id
order, each token's type, merges as "left right" strings, the BOS / EOS / UNK / PAD ids,
add_bos_token / add_eos_token) and names its pre-split rule in `tokenizer.ggml.pre`. Reading
builds the equivalent Hugging Face tokenizer.json and a `PretrainedTokenizer` from it:

- tokens of type 3 (control) become special added tokens, type 4 (user-defined) plain added
  tokens, both matched whole in the text (as llama.cpp and transformers do);
- `tokenizer.ggml.pre` becomes the pre-tokenizer llama.cpp applies (`gguf_pre.PRE_TOKENIZERS`:
  llama-vocab.cpp's regex lists, each a Split in turn, then the byte map): gpt-2 (and gpt2, the
  name sheepop wrote before), smollm / starcoder / refact (each digit alone, then GPT-2's rule:
  SmolLM2's own tokenizer.json, Digits(individual_digits) + ByteLevel), llama-bpe / llama3 /
  llama-v3 (Llama 3's rule, and ignore_merges as llama.cpp sets it), qwen2, falcon, default.
  Another name is refused. Writing, only a name llama.cpp knows for the tokenizer's own rule.
- the BPE model has no unk token, so a byte the vocabulary lacks is dropped, as SmolLM2's own
  tokenizer.json does (pretrained/bpe_model.py).

`tokenizer.ggml.model = "llama"` (a SentencePiece vocabulary with scores and no merges) is
refused: its merges would have to be guessed from the scores, and SentencePiece's tie rule
(leftmost among equal scores) is not a merge rank, so ids could differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.tokenizers.base import Tokenizer
from sheepop.tokenizers.gguf_pre import (
    ALIASES,
    IGNORE_MERGES,
    PRE_TOKENIZERS,
    bpe_pre_name,
    byte_level,
)
from sheepop.tokenizers.pretokenize import token_to_str

TOKEN_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user-defined", 5: "unused",
               6: "byte"}
_HARMLESS = {"scores", "token_type_count", "eot_token_id", "eom_token_id", "sep_token_id",
             "cls_token_id", "mask_token_id", "prefix_token_id", "suffix_token_id",
             "middle_token_id", "fim_pre_token_id", "fim_suf_token_id", "fim_mid_token_id",
             "fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id"}
"""tokenizer.ggml keys that never change how text is encoded (ids of roles sheepop does not
use, SentencePiece scores of a BPE vocabulary)."""
ROLE_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
             "pad": "padding_token_id"}


def tokenizer_from_gguf(meta: Mapping[str, Any], where: str) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes (module docstring); `meta` maps each
    key to its Python value. Its chat template (`tokenizer.chat_template`) is kept."""
    from sheepop.tokenizers.pretrained.tokenizer import PretrainedTokenizer

    def get(key: str, kind: type, default: Any = None) -> Any:
        value = meta.get(f"tokenizer.ggml.{key}", default)
        if value is not default and (not isinstance(value, kind)
                                     or isinstance(value, bool) != (kind is bool)):
            raise UserError(f"{where}: tokenizer.ggml.{key} has the wrong type ({shown(value)})")
        return value

    pre = _pre_tokenizer(meta, get, where)
    tokens, merges = get("tokens", list), get("merges", list, [])
    types = get("token_type", list, [1] * len(tokens if tokens else []))
    if not tokens or not all(isinstance(t, str) for t in tokens) or len(types) != len(tokens) \
            or not all(isinstance(m, str) for m in merges):
        raise UserError(f"{where}: tokenizer.ggml.tokens / token_type / merges must be lists "
                        "of strings (and types) of the same length")
    roles = {}
    for role, key in ROLE_KEYS.items():
        i = get(key, int)
        if i is not None and not 0 <= i < len(tokens):
            raise UserError(f"{where}: tokenizer.ggml.{key} {i} is not an id of the vocabulary")
        roles[role] = None if i is None else tokens[i]
    flags = get("add_bos_token", bool), get("add_eos_token", bool)
    tok = PretrainedTokenizer(_tokenizer_json(tokens, types, merges, pre), roles, *flags,
                              where=where)
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise UserError(f"{where}: tokenizer.chat_template must be a string")
    tok.chat_template = template
    return tok


def _pre_tokenizer(meta: Mapping[str, Any], get: Any, where: str) -> str:
    """The llama.cpp pre-tokenizer name of a byte-level ('gpt2') vocabulary whose every key
    sheepop honours; a UserError naming what it cannot."""
    model = get("model", str)
    if model != "gpt2":
        raise UserError(f"{where}: tokenizer.ggml.model {model!r} is not supported (sheepop "
                        "reads 'gpt2' byte-level BPE vocabularies; a 'llama' SentencePiece "
                        "vocabulary has no merges to read, only scores)")
    _refuse_unknown_keys(meta, where)
    for key in ("add_space_prefix", "add_sep_token", "remove_extra_whitespaces"):
        if get(key, bool, False):
            raise UserError(f"{where}: tokenizer.ggml.{key} is true, which sheepop does not "
                            "apply to a byte-level vocabulary")
    pre = get("pre", str, "default")
    pre = ALIASES.get(pre, pre)
    if pre not in PRE_TOKENIZERS:
        raise UserError(f"{where}: tokenizer.ggml.pre {pre!r} is not supported (sheepop "
                        f"knows {', '.join([*PRE_TOKENIZERS, *ALIASES])})")
    return pre


def _tokenizer_json(tokens: list[str], types: list[int], merges: list[str], pre: str
                    ) -> dict[str, Any]:
    """The Hugging Face tokenizer.json the GGUF vocabulary stands for (types 3 and 4: added
    tokens, 3 special)."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": kind == 3}
             for i, (t, kind) in enumerate(zip(tokens, types)) if kind in (3, 4)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": byte_level(True), "decoder": byte_level(True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": pre in IGNORE_MERGES,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges}}


def _refuse_unknown_keys(meta: Mapping[str, Any], where: str) -> None:
    known = {"model", "pre", "tokens", "token_type", "merges", "add_bos_token",
             "add_eos_token", "add_space_prefix", "add_sep_token", "remove_extra_whitespaces",
             *ROLE_KEYS.values(), *_HARMLESS}
    for key in meta:
        if key.startswith("tokenizer.ggml.") and key[len("tokenizer.ggml."):] not in known:
            raise UserError(f"{where}: {key} is not supported (sheepop refuses what it cannot "
                            "honour, since it may change the ids)")


def gguf_vocab(tok: Tokenizer) -> dict[str, Any]:
    """The `tokenizer.ggml.*` (and `tokenizer.chat_template`) metadata of a byte-level BPE
    tokenizer (sheepop's `bpe` kind or a pretrained one), as llama.cpp and transformers' GGUF
    loader read it."""
    if tok.kind == "bpe":
        meta = _bpe_vocab(tok)
    elif tok.kind == "pretrained":
        meta = _pretrained_vocab(tok)
    else:
        raise UserError(f"a {tok.kind} tokenizer has no GGUF form (GGUF holds byte-level BPE "
                        "vocabularies: the bpe kind or a pretrained one)")
    for role, key in ROLE_KEYS.items():
        i = getattr(tok, f"{role}_id")
        if i is not None:
            meta[f"tokenizer.ggml.{key}"] = i
    if tok.chat_template is not None:
        meta["tokenizer.chat_template"] = tok.chat_template
    return meta


def _bpe_vocab(tok: Any) -> dict[str, Any]:
    """sheepop's byte-level BPE, under the llama.cpp name of its pattern (gguf_pre.py)."""
    pre = bpe_pre_name(tok)
    names = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    specials = set(tok.special_tokens.values())
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": names,
            "tokenizer.ggml.token_type": [3 if i in specials else 1 for i in range(len(names))],
            "tokenizer.ggml.merges": [f"{token_to_str(tok.tokens[a])} "
                                      f"{token_to_str(tok.tokens[b])}" for a, b in tok.merges],
            "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": False}


def _pretrained_vocab(tok: Any) -> dict[str, Any]:
    """A pretrained byte-level BPE, when llama.cpp can say all it does."""
    model, pre = tok.model, _pretrained_pre_name(tok)
    names = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    if len(set(names)) != len(names) or any(" " in a or " " in b for a, b in model.merges):
        raise UserError("this tokenizer's ids are not one token each, or a merge holds a space: "
                        "it has no GGUF form")
    types = [1] * len(names)
    for t in tok.added:
        types[t.id] = 3 if t.special else 4
    before, after = tok.special_affixes
    add_bos, add_eos = before == [tok.bos_id], after == [tok.eos_id]
    if before not in ([], [tok.bos_id]) or after not in ([], [tok.eos_id]):
        raise UserError("this tokenizer adds special ids other than BOS / EOS around a text, "
                        "which GGUF cannot say")
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": names, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": [f"{a} {b}" for a, b in model.merges],
            "tokenizer.ggml.add_bos_token": add_bos, "tokenizer.ggml.add_eos_token": add_eos}


def _pretrained_pre_name(tok: Any) -> str:
    """The llama.cpp name of a pretrained tokenizer's pre-tokenizer, when the rest of it is a
    plain byte-level BPE (no normalizer, byte fallback, affixes or unknown token)."""
    hf, model = tok.to_hf_dict(), tok.model
    pre = next((name for name, spec in PRE_TOKENIZERS.items()
                if _same(spec, hf.get("pre_tokenizer"))), None)
    if pre is None or hf.get("normalizer") is not None or model.byte_fallback \
            or model.prefix or model.suffix or model.unk_token is not None \
            or model.ignore_merges != (pre in IGNORE_MERGES) \
            or (hf.get("decoder") or {}).get("type") != "ByteLevel":
        raise UserError("this pretrained tokenizer is not a byte-level BPE whose pre-tokenizer "
                        "llama.cpp names (gpt-2, smollm, llama-bpe, qwen2, falcon, default), so "
                        "it has no GGUF form")
    return pre


def _same(a: Any, b: Any) -> bool:
    """Two pre-tokenizers / decoders equal up to ByteLevel's trim_offsets (offsets only)."""
    def canonical(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: canonical(v) for k, v in x.items() if k != "trim_offsets"}
        if isinstance(x, list):
            return [canonical(v) for v in x]
        return x
    return canonical(a) == canonical(b)
