"""Moving GPT-2-shaped models between a sheepop run directory and a Hugging Face directory.

A Hugging Face GPT-2 directory holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and the tokenizer: `tokenizer.json` (the `tokenizers` format)
and/or GPT-2's `vocab.json` + `merges.txt`. Export writes all of these (the tokenizer when it is
a byte-level BPE, the only kind with a Hugging Face form), so
`transformers.AutoModelForCausalLM.from_pretrained(out_dir)` and `AutoTokenizer` load it.
Import reads them into a run directory that every sheepop command accepts. Only safetensors
weights are read: a `pytorch_model.bin` is a pickle, which could run code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save as st_save
from safetensors.torch import load as st_load_torch

from sheepop import checkpoint
from sheepop.config import Config
from sheepop.errors import UserError
from sheepop.files import atomic_write_bytes, atomic_write_text, read_bytes, read_json
from sheepop.interop.gpt2 import (
    check_gpt2_shaped,
    from_hf_weights,
    hf_config,
    model_config_from_hf,
    to_hf_weights,
)
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers import loads as load_tokenizer

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# ----- export ---------------------------------------------------------------------------------

def export_gpt2(run_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Write the run's model (and BPE tokenizer) as a Hugging Face GPT-2 directory.

    Returns notes for the user (e.g. a tokenizer that has no Hugging Face form)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    saved = checkpoint.load_config(run_dir)
    cfg = Config.from_dict({k: v for k, v in saved.items() if k == "model"},
                           str(run_dir / checkpoint.CONFIG_FILE)).model
    check_gpt2_shaped(cfg)  # before reading the weights or writing anything
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"output path exists and is not a directory: {out_dir}")
    tokenizer = load_tokenizer(checkpoint.load_tokenizer_json(run_dir),
                               str(run_dir / checkpoint.TOKENIZER_FILE))
    weights = to_hf_weights(checkpoint.load_weights(run_dir), cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    # transformers insists on the "format" metadata of a safetensors file.
    atomic_write_bytes(out_dir / WEIGHTS, st_save(weights, metadata={"format": "pt"}))
    _write_json(out_dir / "config.json", hf_config(cfg, tokenizer.bos_id, tokenizer.eos_id))
    _write_json(out_dir / "generation_config.json",
                {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id})
    return _export_tokenizer(tokenizer, out_dir, cfg.block_size)


def _export_tokenizer(tok: Tokenizer, out_dir: Path, max_length: int) -> list[str]:
    if tok.kind != "bpe":
        return [f"the run's tokenizer is '{tok.kind}', which has no Hugging Face form: wrote "
                f"the model only (encode text with sheepop, or train a bpe tokenizer)"]
    from sheepop.tokenizers.gpt2 import export_gpt2 as export_vocab_merges
    from sheepop.tokenizers.hf import export_hf
    export_hf(tok, out_dir / "tokenizer.json")
    export_vocab_merges(tok, out_dir / "vocab.json", out_dir / "merges.txt")
    special = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "pad_token": tok.pad_id,
               "unk_token": tok.unk_id}
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length,
              "add_prefix_space": False, "clean_up_tokenization_spaces": False}
    config.update({k: tok.id_to_token(i) for k, i in special.items() if i is not None})
    _write_json(out_dir / "tokenizer_config.json", config)
    return []


# ----- import ---------------------------------------------------------------------------------

def import_gpt2(hf_dir: str | Path, run_dir: str | Path, overwrite: bool = False) -> Config:
    """Read a Hugging Face GPT-2 directory into a new sheepop run directory."""
    hf_dir, run_dir = Path(hf_dir), Path(run_dir)
    if not hf_dir.is_dir():
        raise UserError(f"Hugging Face model directory not found: {hf_dir}")
    if (run_dir / checkpoint.CONFIG_FILE).exists() and not overwrite:
        raise UserError(f"{run_dir} already holds a run; choose a new directory")
    hf = read_json(hf_dir / "config.json", what="config.json")
    if not isinstance(hf, dict):
        raise UserError(f"{hf_dir / 'config.json'} is not a JSON object")
    model_cfg = model_config_from_hf(hf, str(hf_dir / "config.json"))
    tokenizer = _import_tokenizer(hf_dir)
    model_cfg, weights = from_hf_weights(_read_weights(hf_dir), model_cfg, str(hf_dir))
    if tokenizer.vocab_size != model_cfg.vocab_size:
        raise UserError(f"{hf_dir}: the tokenizer has {tokenizer.vocab_size} ids but the model "
                        f"{model_cfg.vocab_size} (sheepop needs them equal)")
    cfg = Config()
    cfg.model = model_cfg
    cfg.data.tokenizer, cfg.data.vocab_size = "bpe", tokenizer.vocab_size
    config = {**cfg.to_dict(), "source": {"format": "hf-gpt2", "path": str(hf_dir.resolve())}}
    checkpoint.save_checkpoint(run_dir, weights, config, tokenizer.to_json())
    return cfg


def _read_weights(hf_dir: Path) -> dict[str, np.ndarray]:
    if (hf_dir / WEIGHTS).exists():
        files = [hf_dir / WEIGHTS]
    elif (hf_dir / INDEX).exists():
        index = read_json(hf_dir / INDEX, what=INDEX)
        shards = sorted(set(index.get("weight_map", {}).values())) if isinstance(index, dict) \
            else []
        if not shards:
            raise UserError(f"{hf_dir / INDEX} lists no weight files")
        files = [hf_dir / name for name in shards]
    elif any(hf_dir.glob("*.bin")) or any(hf_dir.glob("*.pt")):
        raise UserError(f"{hf_dir} has only pickle weights (.bin/.pt), which sheepop does not "
                        "load because unpickling can run code: save them as safetensors first "
                        "(model.save_pretrained(dir, safe_serialization=True))")
    else:
        raise UserError(f"{hf_dir} has no {WEIGHTS}")
    state: dict[str, np.ndarray] = {}
    for path in files:
        tensors = checkpoint.parse_safetensors(read_bytes(path, what="weight file"), path,
                                               load=st_load_torch)
        # float16 / bfloat16 checkpoints become float32, sheepop's checkpoint dtype.
        state.update({k: v.to(torch.float32).numpy() for k, v in tensors.items()})
    return state


def _import_tokenizer(hf_dir: Path) -> Tokenizer:
    """The directory's byte-level BPE: from tokenizer.json (its pre-split pattern and special
    tokens kept) or else GPT-2's vocab.json + merges.txt."""
    from sheepop.tokenizers.gpt2 import check_vocab, from_gpt2, import_gpt2, parse_merges
    tj_path = hf_dir / "tokenizer.json"
    if tj_path.exists():
        tj = read_json(tj_path, what="tokenizer.json")
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
    if (hf_dir / "vocab.json").exists() and (hf_dir / "merges.txt").exists():
        return import_gpt2(hf_dir / "vocab.json", hf_dir / "merges.txt")
    raise UserError(f"{hf_dir} has no tokenizer (tokenizer.json, or vocab.json + merges.txt)")


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
