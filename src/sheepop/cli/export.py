"""`sheepop export RUN_DIR --to hf-gpt2 OUT_DIR` and `sheepop import HF_GPT2_DIR RUN_DIR`.

A GPT-2-shaped run (learned positions, gelu_tanh, biases, tied head without bias) becomes a
Hugging Face GPT-2 directory that `transformers` loads with `from_pretrained`, its BPE tokenizer
included; and a Hugging Face GPT-2 directory (safetensors weights) becomes a sheepop run.
"""

from __future__ import annotations

import argparse
import sys

FORMATS = ("hf-gpt2",)


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "export", help="write a trained model in another library's format",
        description="Write a GPT-2-shaped run (model.pos_encoding=learned, "
                    "model.activation=gelu_tanh, model.bias=true, model.tie_weights=true, "
                    "model.head_bias=false) as a Hugging Face GPT-2 directory: config.json, "
                    "model.safetensors and, for a bpe tokenizer, tokenizer.json, vocab.json and "
                    "merges.txt. Other models are refused with the setting that stops them.")
    e.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by `sheepop train`")
    e.add_argument("out_dir", metavar="OUT_DIR", help="the directory to write (created)")
    e.add_argument("--to", choices=FORMATS, required=True, help="the format to write")
    e.set_defaults(func=run_export)

    i = sub.add_parser(
        "import", help="turn a Hugging Face GPT-2 directory into a sheepop run",
        description="Read a Hugging Face GPT-2 directory (config.json, model.safetensors or "
                    "its shards, and tokenizer.json or vocab.json + merges.txt) into a new run "
                    "directory that `sheepop generate` and `sheepop eval` read. Pickle weights "
                    "(pytorch_model.bin) are refused.")
    i.add_argument("hf_dir", metavar="HF_GPT2_DIR", help="a Hugging Face GPT-2 directory "
                   "(config.json and model.safetensors, tokenizer files optional)")
    i.add_argument("run_dir", metavar="RUN_DIR", help="the new run directory")
    i.add_argument("--overwrite", action="store_true", help="replace a run already in RUN_DIR")
    i.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from sheepop.interop import export_gpt2
    for note in export_gpt2(args.run_dir, args.out_dir):
        print(f"sheepop: note: {note}", file=sys.stderr)
    print(f"wrote a Hugging Face GPT-2 model to {args.out_dir}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from sheepop.interop import import_gpt2
    cfg = import_gpt2(args.hf_dir, args.run_dir, overwrite=args.overwrite)
    m = cfg.model
    print(f"imported GPT-2 ({m.n_layer} layers, {m.n_head} heads, width {m.n_embd}, context "
          f"{m.block_size}, vocabulary {m.vocab_size}) into {args.run_dir}")
    return 0
