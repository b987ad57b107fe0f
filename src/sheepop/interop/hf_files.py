"""The files of a Hugging Face model directory that do not depend on the architecture.

A Hugging Face directory holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and the tokenizer: `tokenizer.json` (the `tokenizers` format)
and/or GPT-2's `vocab.json` + `merges.txt`. This module reads and writes the weights files and
the tokenizer (sheepop's byte-level BPE, or a pretrained model's own tokenizer.json read
exactly: sheepop.tokenizers.pretrained) for every architecture `sheepop.interop.hf` converts.
Only safetensors weights are read: a `pytorch_model.bin` is a pickle, which could run code.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save

from sheepop.checkpoint.check import (
    DTYPES,
    MAX_HEADER_BYTES,
    TensorEntry,
    check_dtypes,
    parse_header,
)
from sheepop.errors import UserError
from sheepop.files import atomic_write_bytes, atomic_write_text, open_regular, read_json, shown
from sheepop.tokenizers import Tokenizer

WEIGHTS = "model.safetensors"
# Buffers that transformers recomputes, stored by older checkpoints: skipped unread.
BUFFERS = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")
INDEX = "model.safetensors.index.json"


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_weights(out_dir: Path, weights: dict[str, np.ndarray]) -> None:
    # transformers insists on the "format" metadata of a safetensors file.
    atomic_write_bytes(out_dir / WEIGHTS, st_save(weights, metadata={"format": "pt"}))


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    hf = read_json(hf_dir / "config.json", what="config.json")
    if not isinstance(hf, dict):
        raise UserError(f"{hf_dir / 'config.json'} is not a JSON object")
    return hf


# ----- weights --------------------------------------------------------------------------------

def weight_files(hf_dir: Path) -> list[Path]:
    """The safetensors files holding the weights (refusing pickles before anything is read, and
    an index naming a file outside the directory)."""
    if (hf_dir / WEIGHTS).exists():
        return [hf_dir / WEIGHTS]
    if (hf_dir / INDEX).exists():
        where = hf_dir / INDEX
        index = read_json(where, what=INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{where}: weight_map is not an object of tensor name -> file name")
        names = set()
        for name in weight_map.values():
            if not isinstance(name, str) or not name:
                raise UserError(f"{where}: weight_map names the file {shown(name)}, not a file "
                                "name")
            names.add(name)
        inside = hf_dir.resolve()
        for name in names:
            if not (hf_dir / name).resolve().is_relative_to(inside):
                raise UserError(f"{where}: weight_map names {shown(name)}, which is outside "
                                f"{hf_dir}: sheepop reads weights only from the model's own "
                                "directory")
        return [hf_dir / name for name in sorted(names)]
    if any(hf_dir.glob("*.bin")) or any(hf_dir.glob("*.pt")):
        raise UserError(f"{hf_dir} has only pickle weights (.bin/.pt), which sheepop does not "
                        "load because unpickling can run code: save them as safetensors first "
                        "(model.save_pretrained(dir, safe_serialization=True))")
    raise UserError(f"{hf_dir} has no {WEIGHTS}")


def _header(f: Any, path: Path) -> tuple[int, dict[str, TensorEntry]]:
    """(where the data part starts, the tensors) of an open safetensors file, checked against
    its size (sheepop.checkpoint.check.parse_header) before a tensor is read."""
    size = os.fstat(f.fileno()).st_size
    first = f.read(8)
    n = int.from_bytes(first, "little") if len(first) == 8 else -1
    if n < 0 or n > min(MAX_HEADER_BYTES, size - 8):
        raise UserError(f"{path} is not a valid safetensors file (its header does not fit in "
                        f"its {size:,} bytes)")
    return 8 + n, parse_header(f.read(n), size - 8 - n, str(path))


def _float32(raw: bytes, entry: TensorEntry) -> np.ndarray:
    """One tensor's little-endian bytes as float32 (bfloat16 is the top half of a float32)."""
    values = np.frombuffer(raw, dtype=DTYPES[entry.dtype][1])
    if entry.dtype == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32).reshape(entry.shape)
    with np.errstate(over="ignore"):  # a float64 past float32's range: inf, refused below
        return values.astype(np.float32).reshape(entry.shape)


def read_weights(files: list[Path], max_values: int | None = None) -> dict[str, np.ndarray]:
    """Every tensor of the files as float32 NumPy. Before a tensor is read, each file's header
    is checked against its size, a tensor that is not floating point (integers would be cast
    silently) is refused by name, and so are more than `max_values` numbers in all (the model
    the config describes, so a huge or padded file is refused unread); buffers transformers
    recomputes (`BUFFERS`) are skipped unread. A NaN or infinite weight is refused by name: the
    model would print garbage."""
    located: list[tuple[Path, int, str, TensorEntry]] = []
    for path in files:
        with open_regular(path, what="weight file") as f:
            start, entries = _header(f, path)
        entries = {name: e for name, e in entries.items() if not name.endswith(BUFFERS)}
        check_dtypes(entries, str(path))
        located += [(path, start, name, e) for name, e in entries.items()]
    total = sum(math.prod(e.shape) for *_, e in located)
    if max_values is not None and total > max_values:
        raise UserError(f"the weight files hold {total:,} numbers, more than the {max_values:,} "
                        "parameters config.json describes: not this model's weights")
    state: dict[str, np.ndarray] = {}
    for path in files:
        with open_regular(path, what="weight file") as f:
            for _, start, name, entry in (t for t in located if t[0] == path):
                f.seek(start + entry.begin)
                raw = f.read(entry.end - entry.begin)
                if len(raw) != entry.end - entry.begin:
                    raise UserError(f"{path}: tensor {shown(name)} is cut short (the file "
                                    "changed while it was read)")
                array = _float32(raw, entry)
                bad = array.size - int(np.isfinite(array).sum())
                if bad:
                    raise UserError(f"{path}: tensor {shown(name)} holds {bad:,} NaN or "
                                    f"infinite values (of {array.size:,}): these weights "
                                    "cannot run")
                state[name] = array
    return state


# ----- tokenizer ------------------------------------------------------------------------------

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
    if tok.chat_template is not None:  # the model's own, or sheepop.tokenizers.chat's
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
    tokenizer.json that sheepop exported from its own bpe kind comes back as that bpe kind."""
    tj_path, config_path = hf_dir / "tokenizer.json", hf_dir / "tokenizer_config.json"
    config = read_json(config_path, what="tokenizer_config.json") if config_path.exists() \
        else None
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


def _sheepop_template(tok: Tokenizer, config: Any) -> None:
    """sheepop's own chat template, when tokenizer_config.json holds exactly that one."""
    from sheepop.tokenizers.chat import CHAT_TEMPLATE
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
