"""`sheepop export RUN_DIR OUT.gguf --to gguf`: a Llama-shaped run as a llama.cpp GGUF file.

The file is what llama.cpp's own converter (convert_hf_to_gguf.py) writes for a Llama model, so
llama.cpp, Ollama and LM Studio load it: general.architecture "llama", the llama.* fields
(`sheepop.interop.gguf_config.llama_metadata`), the tokenizer as tokenizer.ggml.* fields
(`sheepop.tokenizers.gguf_vocab.gguf_vocab`, chat template included), and the tensors under
llama.cpp's names (the inverse of `sheepop.interop.gguf`'s table; q and k rows already in the
interleaved rotary order llama.cpp rotates). A tied head writes no output.weight.

Weights are written as `--gguf-type`: f32 (exact), f16, bf16 or q8_0 (blocks of 32 weights as
int8 times one float16 scale, d = max|w| / 127); norms and every other vector stay float32, as
llama.cpp's converter keeps them. A q8_0 matrix whose rows are not a multiple of 32 long is
written as f16 (the converter's fallback too), with a note. The file is written under a temporary
name and renamed, so a failed export leaves no half file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config
from sheepop.errors import UserError
from sheepop.inference.load import read_run
from sheepop.interop.gguf_config import llama_metadata
from sheepop.interop.llama import check_llama_shaped
from sheepop.tokenizers import loads as load_tokenizer

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")
_BLOCK = {"ln1.weight": "attn_norm.weight", "ln2.weight": "ffn_norm.weight",
          "attn.proj.weight": "attn_output.weight", "ffn.gate.weight": "ffn_gate.weight",
          "ffn.up.weight": "ffn_up.weight", "ffn.proj.weight": "ffn_down.weight"}


def _file_type(gguf_type: str) -> int:
    """general.file_type: llama.cpp's LLAMA_FTYPE of a file whose matrices are `gguf_type`."""
    from gguf import LlamaFileType as F
    return {"f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16,
            "q8_0": F.MOSTLY_Q8_0}[gguf_type]


def gguf_tensors(weights: dict[str, np.ndarray], n_layer: int, n_head: int, kv_heads: int,
                 head_dim: int, tied: bool) -> dict[str, np.ndarray]:
    """sheepop's weights under llama.cpp's names, float32 (attn.qkv split into q, k, v)."""
    out = {"token_embd.weight": weights["tok_emb.weight"],
           "output_norm.weight": weights["ln_f.weight"]}
    if not tied:
        out["output.weight"] = weights["head.weight"]
    for i in range(n_layer):
        ours, theirs = f"blocks.{i}.", f"blk.{i}."
        out.update({theirs + t: weights[ours + o] for o, t in _BLOCK.items()})
        q, k, v = np.split(weights[ours + "attn.qkv.weight"],
                           [n_head * head_dim, (n_head + kv_heads) * head_dim])
        out.update({theirs + "attn_q.weight": q, theirs + "attn_k.weight": k,
                    theirs + "attn_v.weight": v})
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _encoded(w: np.ndarray, gguf_type: str) -> tuple[np.ndarray, Any, bool]:
    """(the data to write, its GGML type, whether q8_0 fell back to f16)."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize
    if w.ndim == 1 or gguf_type == "f32":
        return w, Q.F32, False
    if gguf_type == "q8_0" and w.shape[-1] % 32 == 0:
        return quantize(w, Q.Q8_0), Q.Q8_0, False
    if gguf_type == "bf16":
        return quantize(w, Q.BF16), Q.BF16, False
    return w.astype(np.float16), Q.F16, gguf_type == "q8_0"


def add_value(writer: Any, key: str, value: Any) -> None:
    """One metadata field with the type llama.cpp reads it as: an int as uint32 (int32 when
    negative), a float as float32, lists typed by their elements (ints int32: token types)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        (writer.add_uint32 if value >= 0 else writer.add_int32)(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)) and value:
        writer.add_array(key, list(value))
    else:
        raise ValueError(f"cannot write GGUF metadata {key} = {value!r}")


def export_gguf(run_dir: str | Path, out_path: str | Path, gguf_type: str = "f32") -> list[str]:
    """Write a Llama-shaped run (a LoRA run: merged) as one GGUF file of `gguf_type` weights.
    Returns notes for the user. Refused before anything is written: another shape, a tokenizer
    with no GGUF form (char, word, digits), an output path that is a directory."""
    if gguf_type not in GGUF_TYPES:
        raise UserError(f"unknown GGUF type {gguf_type!r} (known: {', '.join(GGUF_TYPES)})")
    run_dir, out_path = Path(run_dir), Path(out_path)
    saved = checkpoint.load_config(run_dir)
    cfg = Config.from_dict({k: v for k, v in saved.items() if k == "model"},
                           str(run_dir / checkpoint.CONFIG_FILE)).model
    check_llama_shaped(cfg)
    if out_path.is_dir():
        raise UserError(f"{out_path} is a directory; give the GGUF file to write")
    tokenizer = load_tokenizer(checkpoint.load_tokenizer_json(run_dir),
                               str(run_dir / checkpoint.TOKENIZER_FILE))
    from sheepop.tokenizers.gguf_vocab import gguf_vocab
    vocab = gguf_vocab(tokenizer)  # refuses a tokenizer without a GGUF form
    weights = gguf_tensors(read_run(run_dir)[2], cfg.n_layer, cfg.n_head, cfg.kv_heads,
                           cfg.head_dim, cfg.tie_weights)
    from gguf import GGUFWriter
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    writer = GGUFWriter(tmp, "llama")
    writer.add_type("model")
    writer.add_name(run_dir.resolve().name)
    writer.add_file_type(_file_type(gguf_type))
    if gguf_type == "q8_0":
        from gguf import GGML_QUANT_VERSION
        writer.add_quantization_version(GGML_QUANT_VERSION)
    for key, value in {**llama_metadata(cfg), **vocab}.items():
        add_value(writer, key, value)
    fell_back = []
    for name, w in weights.items():
        data, qtype, fallback = _encoded(w, gguf_type)
        writer.add_tensor(name, data, raw_dtype=qtype)
        fell_back += [name] if fallback else []
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        fd = os.open(tmp, os.O_RDONLY)  # on disk before the rename makes it the file
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out_path)
    except BaseException:
        try:
            writer.close()  # flushing may fail again (a full disk): the unlink still runs
        except OSError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        raise
    if fell_back:
        return [f"{len(fell_back)} matrices have rows whose length is not a multiple of 32 and "
                f"were written as f16, not q8_0 (first: {fell_back[0]})"]
    return []
