"""`sheepop import MODEL.gguf RUN_DIR`: a llama.cpp GGUF file as a sheepop run directory.

Two architectures (general.architecture): `llama` (Llama, SmolLM, Mistral-shaped models) and
`gpt2`. The tensors are dequantized to float32 (`sheepop.interop.gguf_tensors`), the metadata
becomes the config (`sheepop.interop.gguf_config`), the tokenizer and its chat template come from
the tokenizer.ggml.* fields (`sheepop.tokenizers.gguf_vocab`). The names map one to one:

    sheepop                        GGUF llama                     GGUF gpt2
    tok_emb.weight                 token_embd.weight              token_embd.weight
    pos_emb.weight                 -                              position_embd.weight
    blocks.{i}.ln1 / ln2           blk.{i}.attn_norm / ffn_norm   the same (weight and bias)
    blocks.{i}.attn.qkv  [Q; K; V] blk.{i}.attn_q / _k / _v       blk.{i}.attn_qkv (fused)
    blocks.{i}.attn.proj           blk.{i}.attn_output            blk.{i}.attn_output
    blocks.{i}.ffn.gate / up       blk.{i}.ffn_gate / ffn_up      - / blk.{i}.ffn_up (ffn.fc)
    blocks.{i}.ffn.proj            blk.{i}.ffn_down               blk.{i}.ffn_down
    ln_f                           output_norm                    output_norm
    head.weight (untied only)      output.weight                  output.weight

Every matrix is stored as torch's (out, in), sheepop's convention (GGUF's dims [in, out] read in
NumPy order; GPT-2's Conv1D weights were transposed by llama.cpp's converter). The rotary pairs
need no renumbering: llama.cpp's converter permutes Hugging Face's rotate-half rows of q and k
back to the original interleaved order, row (h, 2i + half) = HF row (h, half * dk/2 + i), which
is the order sheepop rotates in (pairs 2i, 2i+1; `sheepop.interop.llama`). A llama file without
output.weight has a tied head (llama.cpp then uses token_embd); a gpt2 file's output.weight equal
to its token_embd is the tied head too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.interop.gguf_config import model_config_from_gguf
from sheepop.interop.gguf_tensors import GGUFFile, read_gguf

Weights = dict[str, np.ndarray]

# sheepop name -> GGUF name, per block.
_LLAMA_BLOCK = {"ln1.weight": "attn_norm.weight", "ln2.weight": "ffn_norm.weight",
                "attn.proj.weight": "attn_output.weight", "ffn.gate.weight": "ffn_gate.weight",
                "ffn.up.weight": "ffn_up.weight", "ffn.proj.weight": "ffn_down.weight"}
_LLAMA_QKV = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
_GPT2_BLOCK = {f"{ours}.{p}": f"{theirs}.{p}" for p in ("weight", "bias")
               for ours, theirs in (("ln1", "attn_norm"), ("ln2", "ffn_norm"),
                                    ("attn.qkv", "attn_qkv"), ("attn.proj", "attn_output"),
                                    ("ffn.fc", "ffn_up"), ("ffn.proj", "ffn_down"))}
_GPT2_TOP = {"tok_emb.weight": "token_embd.weight", "pos_emb.weight": "position_embd.weight",
             "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}
_LLAMA_TOP = {"tok_emb.weight": "token_embd.weight", "ln_f.weight": "output_norm.weight"}


@dataclass(frozen=True)
class GGUFArchitecture:
    name: str  # for messages: "Llama"
    gguf_name: str  # general.architecture: "llama"


LLAMA = GGUFArchitecture("Llama", "llama")
GPT2 = GGUFArchitecture("GPT-2", "gpt2")
ARCHITECTURES = {a.gguf_name: a for a in (LLAMA, GPT2)}
_REFUSED = {
    "qwen2": "its attention has biases on q, k and v only, which sheepop's Llama-shaped model "
             "has no setting for",
}


def _names(cfg: ModelConfig, arch: GGUFArchitecture) -> dict[str, str | tuple[str, ...]]:
    """sheepop name -> the GGUF tensor(s) it is made of (a tuple: q, k, v stacked)."""
    top, block = (_LLAMA_TOP, _LLAMA_BLOCK) if arch is LLAMA else (_GPT2_TOP, _GPT2_BLOCK)
    names: dict[str, str | tuple[str, ...]] = dict(top)
    for i in range(cfg.n_layer):
        names.update({f"blocks.{i}.{ours}": f"blk.{i}.{theirs}" for ours, theirs in block.items()})
        if arch is LLAMA:
            names[f"blocks.{i}.attn.qkv.weight"] = tuple(f"blk.{i}.{n}" for n in _LLAMA_QKV)
    if not cfg.tie_weights:
        names["head.weight"] = "output.weight"
    return names


def _shapes(cfg: ModelConfig, arch: GGUFArchitecture) -> dict[str, tuple[int, ...]]:
    """Every GGUF tensor `cfg` needs, with its shape in NumPy order."""
    d, f, V, dk = cfg.n_embd, cfg.ffn_dim, cfg.vocab_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, d), "output_norm.weight": (d,)}
    if arch is GPT2:
        shapes.update({"position_embd.weight": (cfg.block_size, d), "output_norm.bias": (d,)})
    for i in range(cfg.n_layer):
        if arch is LLAMA:
            block = {"attn_norm.weight": (d,), "ffn_norm.weight": (d,),
                     "attn_q.weight": (cfg.n_head * dk, d), "attn_k.weight": (cfg.kv_heads * dk, d),
                     "attn_v.weight": (cfg.kv_heads * dk, d), "attn_output.weight": (d, d),
                     "ffn_gate.weight": (f, d), "ffn_up.weight": (f, d), "ffn_down.weight": (d, f)}
        else:
            block = {"attn_norm.weight": (d,), "attn_norm.bias": (d,), "ffn_norm.weight": (d,),
                     "ffn_norm.bias": (d,), "attn_qkv.weight": (3 * d, d),
                     "attn_qkv.bias": (3 * d,), "attn_output.weight": (d, d),
                     "attn_output.bias": (d,), "ffn_up.weight": (f, d), "ffn_up.bias": (f,),
                     "ffn_down.weight": (d, f), "ffn_down.bias": (d,)}
        shapes.update({f"blk.{i}.{k}": v for k, v in block.items()})
    if arch is GPT2 or not cfg.tie_weights:  # (optional for gpt2: then tied)
        shapes["output.weight"] = (V, d)
    return shapes


def read_model(path: str | Path) -> tuple[ModelConfig, GGUFArchitecture, Weights, GGUFFile]:
    """A GGUF file's model: its config, architecture and float32 sheepop weights (and the open
    file, whose metadata holds the tokenizer). Everything is checked before a tensor is
    dequantized: the architecture, every metadata field, every tensor's name, shape and type."""
    gguf = read_gguf(path)
    where, meta = gguf.where, gguf.meta
    kind = meta.get("general.type", "model")
    if kind != "model":
        raise UserError(f"{where}: general.type is {kind!r}; sheepop imports a model (a "
                        "LoRA adapter GGUF is applied by llama.cpp to its base model)")
    if int(meta.get("split.count", 1)) > 1:
        raise UserError(f"{where} is one part of a split GGUF ({meta['split.count']} files): "
                        "merge them first (llama-gguf-split --merge FIRST.gguf OUT.gguf)")
    name = meta.get("general.architecture")
    if name in _REFUSED:
        raise UserError(f"{where}: architecture {name!r} is not supported: {_REFUSED[name]}")
    if name not in ARCHITECTURES:
        raise UserError(f"{where}: architecture {name!r} is not supported (sheepop imports "
                        f"{', '.join(repr(a) for a in ARCHITECTURES)})")
    arch = ARCHITECTURES[name]
    if "token_embd.weight" not in gguf.tensors:
        raise UserError(f"{where}: the file has no token_embd.weight")
    cfg = model_config_from_gguf(meta, where, vocab_rows=gguf.shape("token_embd.weight")[0])
    if arch is LLAMA:
        cfg = dataclasses.replace(cfg, tie_weights="output.weight" not in gguf.tensors)
    _validate(cfg, where)
    _check_tensors(gguf, _shapes(cfg, arch))
    gguf.check_types()
    weights = {}
    for ours, theirs in _names(cfg, arch).items():
        parts = theirs if isinstance(theirs, tuple) else (theirs,)
        weights[ours] = np.concatenate([gguf.array(t) for t in parts])
    if arch is GPT2:
        head = gguf.array("output.weight") if "output.weight" in gguf.tensors else None
        if head is not None and not np.array_equal(head, weights["tok_emb.weight"]):
            cfg = dataclasses.replace(cfg, tie_weights=False)
            weights["head.weight"] = head
    return cfg, arch, weights, gguf


def _validate(cfg: ModelConfig, where: str) -> None:
    config = Config()
    config.model = cfg
    try:
        config.validate()
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def _check_tensors(gguf: GGUFFile, shapes: dict[str, tuple[int, ...]]) -> None:
    missing = sorted(set(shapes) - set(gguf.tensors) - {"output.weight"})
    if missing:
        raise UserError(f"{gguf.where}: the file lacks tensor {missing[0]}")
    unexpected = sorted(set(gguf.tensors) - set(shapes))
    if unexpected:
        raise UserError(f"{gguf.where}: unexpected tensor {unexpected[0]} (sheepop does not "
                        "know what it computes)")
    for name, shape in shapes.items():
        if name in gguf.tensors and gguf.shape(name) != shape:
            raise UserError(f"{gguf.where}: tensor {name} has shape {gguf.shape(name)}, the "
                            f"metadata says {shape}")


def import_gguf(path: str | Path, run_dir: str | Path, overwrite: bool = False
                ) -> tuple[Config, GGUFArchitecture]:
    """Read a GGUF file into a new sheepop run directory (weights in float32, the config, the
    tokenizer with its chat template); nothing is written when anything is refused."""
    path, run_dir = Path(path), Path(run_dir)
    if (run_dir / checkpoint.CONFIG_FILE).exists() and not overwrite:
        raise UserError(f"{run_dir} already holds a run; choose a new directory")
    model, arch, weights, gguf = read_model(path)
    from sheepop.tokenizers.gguf_vocab import tokenizer_from_gguf
    tokenizer = tokenizer_from_gguf(gguf.meta, gguf.where)
    if tokenizer.vocab_size != model.vocab_size:
        raise UserError(f"{path}: the tokenizer has {tokenizer.vocab_size} ids but the model "
                        f"{model.vocab_size} (sheepop needs them equal)")
    cfg = Config()
    cfg.model = model
    cfg.data.tokenizer, cfg.data.vocab_size = tokenizer.kind, tokenizer.vocab_size
    config = {**cfg.to_dict(), "source": {"format": "gguf", "path": str(path.resolve()),
                                          "architecture": arch.gguf_name}}
    checkpoint.save_checkpoint(run_dir, weights, config, tokenizer.to_json())
    return cfg, arch
