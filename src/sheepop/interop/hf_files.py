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
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save

from sheepop import checkpoint
from sheepop.errors import UserError
from sheepop.files import atomic_write_bytes, atomic_write_text, read_bytes, read_json
from sheepop.tokenizers import Tokenizer

WEIGHTS = "model.safetensors"
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
    """The safetensors files holding the weights (refusing pickles before anything is read)."""
    if (hf_dir / WEIGHTS).exists():
        return [hf_dir / WEIGHTS]
    if (hf_dir / INDEX).exists():
        index = read_json(hf_dir / INDEX, what=INDEX)
        shards = sorted(set(index.get("weight_map", {}).values())) if isinstance(index, dict) \
            else []
        if not shards:
            raise UserError(f"{hf_dir / INDEX} lists no weight files")
        return [hf_dir / name for name in shards]
    if any(hf_dir.glob("*.bin")) or any(hf_dir.glob("*.pt")):
        raise UserError(f"{hf_dir} has only pickle weights (.bin/.pt), which sheepop does not "
                        "load because unpickling can run code: save them as safetensors first "
                        "(model.save_pretrained(dir, safe_serialization=True))")
    raise UserError(f"{hf_dir} has no {WEIGHTS}")


def read_weights(files: list[Path]) -> dict[str, np.ndarray]:
    """Every tensor of the files, as float32 NumPy (through torch, which reads bfloat16)."""
    import torch
    from safetensors.torch import load as st_load_torch
    state: dict[str, np.ndarray] = {}
    for path in files:
        tensors = checkpoint.parse_safetensors(read_bytes(path, what="weight file"), path,
                                               load=st_load_torch)
        # float16 / bfloat16 checkpoints become float32, sheepop's checkpoint dtype.
        state.update({k: v.to(torch.float32).numpy() for k, v in tensors.items()})
    return state


# ----- tokenizer ------------------------------------------------------------------------------

def export_tokenizer(tok: Tokenizer, out_dir: Path, max_length: int) -> list[str]:
    """Write a byte-level BPE as tokenizer.json, vocab.json + merges.txt and
    tokenizer_config.json, or a pretrained tokenizer as its own tokenizer.json and
    tokenizer_config.json; any other kind gets a note for the user instead."""
    if tok.kind == "pretrained":
        return _export_pretrained(tok, out_dir, max_length)
    if tok.kind != "bpe":
        return [f"the run's tokenizer is '{tok.kind}', which has no Hugging Face form: wrote "
                f"the model only (encode text with sheepop, or train a bpe tokenizer)"]
    from sheepop.tokenizers.gpt2 import export_gpt2 as export_vocab_merges
    from sheepop.tokenizers.hf import export_hf
    export_hf(tok, out_dir / "tokenizer.json")
    export_vocab_merges(tok, out_dir / "vocab.json", out_dir / "merges.txt")
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length,
              "add_prefix_space": False, "clean_up_tokenization_spaces": False}
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
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    added = [t for t in tj.get("added_tokens", []) if isinstance(t, dict)]
    vocab = {**model["vocab"], **{t.get("content"): t.get("id") for t in added}}
    specials = [t["content"] for t in added if t.get("special")]
    where = str(tj_path)
    return from_gpt2(check_vocab(vocab, where), parse_merges("\n".join(merges), where),
                     specials, _split_pattern(tj) or "gpt2-exact", where, where)


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
