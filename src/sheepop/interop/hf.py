"""Moving models between a sheepop run directory and a Hugging Face directory.

Two architectures, each a module with the same five functions (the shape check, the config
both ways, the weights both ways): GPT-2 (`sheepop.interop.gpt2`, GPT2LMHeadModel) and Llama
(`sheepop.interop.llama`, LlamaForCausalLM). Export writes config.json, model.safetensors,
generation_config.json and the BPE tokenizer (`sheepop.interop.hf_files`), so
`transformers.AutoModelForCausalLM.from_pretrained(out_dir)` and `AutoTokenizer` load it; import
picks the architecture from config.json's `model_type` and writes a run directory that every
sheepop command accepts, its [sample] settings from generation_config.json when there is one
(sheepop.interop.generation_config; recorded in config.json's source.generation_config).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.config.model_size import param_count
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.inference.load import read_run
from sheepop.interop import gpt2, llama
from sheepop.interop.generation_config import apply_generation_config, read_generation_config
from sheepop.interop.hf_files import (
    read_hf_config,
    read_weights,
    weight_files,
    write_json,
    write_weights,
)
from sheepop.interop.hf_tokenizer import export_tokenizer, import_tokenizer
from sheepop.tokenizers import loads as load_tokenizer

Weights = dict[str, np.ndarray]


@dataclass(frozen=True)
class Architecture:
    name: str  # for messages: "GPT-2"
    format: str  # `sheepop export --to` and the run's source.format: "hf-gpt2"
    model_type: str  # config.json's model_type: "gpt2"
    check_shaped: Callable[[ModelConfig], None]
    hf_config: Callable[[ModelConfig, int | None, int | None], dict[str, Any]]
    to_hf_weights: Callable[[Weights, ModelConfig], Weights]
    model_config_from_hf: Callable[[dict[str, Any], str], ModelConfig]
    from_hf_weights: Callable[[Weights, ModelConfig, str], tuple[ModelConfig, Weights]]


GPT2 = Architecture("GPT-2", "hf-gpt2", "gpt2", gpt2.check_gpt2_shaped, gpt2.hf_config,
                    gpt2.to_hf_weights, gpt2.model_config_from_hf, gpt2.from_hf_weights)
LLAMA = Architecture("Llama", "hf-llama", "llama", llama.check_llama_shaped, llama.hf_config,
                     llama.to_hf_weights, llama.model_config_from_hf, llama.from_hf_weights)
ARCHITECTURES = {a.format: a for a in (GPT2, LLAMA)}


# ----- export ---------------------------------------------------------------------------------

def export_hf(run_dir: str | Path, out_dir: str | Path, format: str) -> list[str]:
    """Write the run's model (and BPE tokenizer) as a Hugging Face directory of `format`
    (hf-gpt2 | hf-llama). Returns notes for the user (e.g. a tokenizer that has no Hugging
    Face form). A model the format cannot hold is refused before anything is written."""
    arch = _architecture(format)
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    saved = checkpoint.load_config(run_dir)
    cfg = Config.from_dict({k: v for k, v in saved.items() if k == "model"},
                           str(run_dir / checkpoint.CONFIG_FILE)).model
    _check_shaped(arch, cfg)  # before reading the weights or writing anything
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"output path exists and is not a directory: {out_dir}")
    tokenizer = load_tokenizer(checkpoint.load_tokenizer_json(run_dir),
                               str(run_dir / checkpoint.TOKENIZER_FILE))
    weights = arch.to_hf_weights(read_run(run_dir)[2], cfg)  # a LoRA run: merged
    out_dir.mkdir(parents=True, exist_ok=True)
    write_weights(out_dir, weights)
    write_json(out_dir / "config.json", arch.hf_config(cfg, tokenizer.bos_id, tokenizer.eos_id))
    write_json(out_dir / "generation_config.json",
               {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id})
    return export_tokenizer(tokenizer, out_dir, cfg.block_size)


def _check_shaped(arch: Architecture, cfg: ModelConfig) -> None:
    """`arch`'s refusal of `cfg`, naming the other format when that one takes the model."""
    try:
        arch.check_shaped(cfg)
    except UserError as refusal:
        takers = []
        for other in ARCHITECTURES.values():
            try:
                other.check_shaped(cfg)
                takers.append(other.format)
            except UserError:
                pass
        if not takers:
            raise
        raise UserError(f"{refusal} (--to {takers[0]} takes this model)") from None


def export_gpt2(run_dir: str | Path, out_dir: str | Path) -> list[str]:
    return export_hf(run_dir, out_dir, GPT2.format)


def export_llama(run_dir: str | Path, out_dir: str | Path) -> list[str]:
    return export_hf(run_dir, out_dir, LLAMA.format)


def _architecture(format: str) -> Architecture:
    if format not in ARCHITECTURES:
        raise UserError(f"unknown export format {format!r} (known: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[format]


# ----- import ---------------------------------------------------------------------------------

def import_hf(hf_dir: str | Path, run_dir: str | Path, overwrite: bool = False,
              model_type: str | None = None) -> tuple[Config, Architecture]:
    """Read a Hugging Face directory into a new sheepop run directory; the architecture is
    config.json's model_type (or must be `model_type` when given)."""
    hf_dir, run_dir = Path(hf_dir), Path(run_dir)
    if not hf_dir.is_dir():
        raise UserError(f"Hugging Face model directory not found: {hf_dir}")
    if (run_dir / checkpoint.CONFIG_FILE).exists() and not overwrite:
        raise UserError(f"{run_dir} already holds a run; choose a new directory")
    hf = read_hf_config(hf_dir)
    where = str(hf_dir / "config.json")
    known = {a.model_type: a for a in ARCHITECTURES.values()}
    arch = known.get(model_type or hf.get("model_type"))
    if arch is None:
        raise UserError(f"{where}: model_type is {hf.get('model_type')!r}; sheepop imports "
                        f"{', '.join(repr(t) for t in known)}")
    cfg = Config()
    cfg.model = arch.model_config_from_hf(hf, where)  # refuses another model_type too
    try:
        cfg.validate()  # (before any weight is read)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    files = weight_files(hf_dir)  # pickles refused before the tokenizer is looked at
    tokenizer = import_tokenizer(hf_dir)
    # At most the model's own numbers are read (its head counted even when tied: a checkpoint
    # may store lm_head beside a tied embedding).
    limit = param_count(dataclasses.replace(cfg.model, tie_weights=False))
    cfg.model, weights = arch.from_hf_weights(read_weights(files, limit), cfg.model, str(hf_dir))
    if tokenizer.vocab_size != cfg.model.vocab_size:
        raise UserError(f"{hf_dir}: the tokenizer has {tokenizer.vocab_size} ids but the model "
                        f"{cfg.model.vocab_size} (sheepop needs them equal)")
    cfg.data.tokenizer, cfg.data.vocab_size = tokenizer.kind, tokenizer.vocab_size
    source: dict[str, Any] = {"format": arch.format, "path": str(hf_dir.resolve())}
    generation = read_generation_config(hf_dir)
    if generation is not None:  # the authors' sampling replaces sheepop's defaults
        taken, notes = apply_generation_config(generation, cfg, tokenizer.eos_id,
                                               str(hf_dir / "generation_config.json"))
        source["generation_config"] = {"read": taken, "notes": notes}
    config = {**cfg.to_dict(), "source": source}
    checkpoint.save_checkpoint(run_dir, weights, config, tokenizer.to_json())
    return cfg, arch


def import_gpt2(hf_dir: str | Path, run_dir: str | Path, overwrite: bool = False) -> Config:
    """Read a Hugging Face GPT-2 directory into a new sheepop run directory."""
    return import_hf(hf_dir, run_dir, overwrite, model_type=GPT2.model_type)[0]


def import_llama(hf_dir: str | Path, run_dir: str | Path, overwrite: bool = False) -> Config:
    """Read a Hugging Face Llama directory into a new sheepop run directory."""
    return import_hf(hf_dir, run_dir, overwrite, model_type=LLAMA.model_type)[0]
