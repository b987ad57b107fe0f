"""`sheepop export RUN_DIR OUT --to hf-gpt2|hf-llama|gguf` and `sheepop import SOURCE RUN_DIR`.

A GPT-2-shaped run (learned positions, gelu_tanh, biases, tied head without bias) becomes a
Hugging Face GPT-2 directory, a Llama-shaped one (rope, rmsnorm, swiglu, no biases) a Llama
directory, each loaded by `transformers`' `from_pretrained`, the BPE tokenizer included, or one
GGUF file for llama.cpp, Ollama and LM Studio. `import` reads a Hugging Face GPT-2 or Llama
directory (safetensors weights) or a GGUF file (told apart by its first bytes, b"GGUF", not by its
name) into a sheepop run.
"""

from __future__ import annotations

import argparse
import sys

# The names of sheepop.interop.hf.ARCHITECTURES, then GGUF, and the GGUF weight types of
# sheepop.interop.gguf_export.GGUF_TYPES, written out so that building the parser does not import
# the converters (tests check that the lists agree).
GGUF = "gguf"
FORMATS = ("hf-gpt2", "hf-llama", GGUF)
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "export", help="write a trained model in another library's format",
        description="Write a run as a Hugging Face directory: config.json, model.safetensors "
                    "and, for a bpe tokenizer, tokenizer.json, vocab.json and merges.txt; or, "
                    "with --to gguf, a Llama-shaped run as one GGUF file (OUT is the file) that "
                    "llama.cpp, Ollama and LM Studio run. "
                    "hf-gpt2 takes a GPT-2-shaped run (model.pos_encoding=learned, "
                    "model.activation=gelu_tanh, model.bias=true, model.tie_weights=true, "
                    "model.head_bias=false); hf-llama a Llama-shaped one "
                    "(model.pos_encoding=rope, model.norm=rmsnorm, model.ffn=swiglu, "
                    "model.bias=false, model.head_bias=false; any model.n_kv_head, tied head or "
                    "not). Other models are refused with the setting that stops them.")
    e.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by `sheepop train`")
    e.add_argument("out_dir", metavar="OUT", help="the directory to write (created; one that "
                   "holds files needs --overwrite), or the .gguf file with --to gguf")
    e.add_argument("--to", choices=FORMATS, help="the format to write")
    e.add_argument("--gguf-type", choices=GGUF_TYPES, default="f32",
                   help="with --to gguf: how the weight matrices are stored: f32 (exact, the "
                        "default), f16, bf16 or q8_0 (8 bits a weight and a scale per 32, "
                        "about a quarter of f32); norms stay f32")
    e.add_argument("--merge-lora", action="store_true",
                   help="instead of --to: write a LoRA run (sheepop finetune --lora-rank) as a "
                        "plain sheepop run, each adapted weight merged: W + (alpha/r) B A")
    e.add_argument("--adapters", action="store_true",
                   help="with --to, for a LoRA run: write the base model unmerged and the "
                        "adapters in the PEFT layout in OUT_DIR/adapter (adapter_config.json, "
                        "adapter_model.safetensors); without it a LoRA run is exported merged")
    e.add_argument("--overwrite", action="store_true",
                   help="replace what OUT holds (a model directory, or the .gguf file): the "
                        "old files are removed, none stays beside the new model")
    e.set_defaults(func=run_export)

    i = sub.add_parser(
        "import", help="turn a GGUF file or a Hugging Face GPT-2 or Llama directory into a "
                       "sheepop run",
        description="Read a GGUF file (architecture llama or gpt2; tensors F32, F16, BF16, "
                    "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K, dequantized to float32; "
                    "the tokenizer and chat template from its metadata) or a Hugging Face "
                    "directory (config.json with model_type gpt2 or llama, model.safetensors or "
                    "its shards, and tokenizer.json or vocab.json + merges.txt) into a new run "
                    "directory that every sheepop command reads. Pickle weights "
                    "(pytorch_model.bin) are refused, and so is anything sheepop cannot compute "
                    "(e.g. rope scaling), naming its field.")
    i.add_argument("hf_dir", metavar="SOURCE", help="a .gguf file, or a Hugging Face GPT-2 or "
                   "Llama directory (config.json and model.safetensors, tokenizer files "
                   "optional)")
    i.add_argument("run_dir", metavar="RUN_DIR", help="the new run directory")
    i.add_argument("--overwrite", action="store_true", help="replace a run already in RUN_DIR")
    i.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sheepop.cli.writing import replacing, undone_on_failure, writing
    from sheepop.errors import UserError
    out = Path(args.out_dir)
    if args.to == GGUF:  # one file, written under a temporary name and renamed
        from sheepop.interop.gguf_tensors import is_gguf
        if out.is_file() and not args.overwrite:  # (a directory: refused by the writer)
            raise UserError(f"{out} already exists (use --overwrite to replace it)")
        if out.is_file() and not is_gguf(out):  # --overwrite replaces a model, nothing else
            raise UserError(f"refusing to overwrite {out}: it is not a GGUF file (choose "
                            "another name)")
        with writing(out, "the export"), undone_on_failure(out.parent):
            return _run_export(args)
    with writing(out, "the export"), replacing(out, args.overwrite):
        return _run_export(args)


def _run_export(args: argparse.Namespace) -> int:
    from sheepop.errors import UserError
    if (args.to is None) == (not args.merge_lora):
        raise UserError("sheepop export needs exactly one of --to FORMAT and --merge-lora")
    if args.merge_lora:
        from sheepop.finetune.merge import write_merged
        write_merged(args.run_dir, args.out_dir)
        print(f"wrote the merged model to {args.out_dir}")
        return 0
    if args.to == GGUF:
        return _export_gguf(args)
    from sheepop.interop import ARCHITECTURES, export_hf
    if args.adapters:
        from sheepop.finetune.merge import export_with_adapters
        notes = export_with_adapters(args.run_dir, args.out_dir, args.to)
    else:
        notes = export_hf(args.run_dir, args.out_dir, args.to)
    for note in notes:
        print(f"sheepop: note: {note}", file=sys.stderr)
    print(f"wrote a Hugging Face {ARCHITECTURES[args.to].name} model to {args.out_dir}"
          + (f" and its PEFT adapter to {args.out_dir}/adapter" if args.adapters else ""))
    return 0


def _export_gguf(args: argparse.Namespace) -> int:
    from sheepop.errors import UserError
    if args.adapters:
        raise UserError("--adapters writes a PEFT adapter beside a Hugging Face model; a GGUF "
                        "file holds the model with its adapters merged (leave --adapters out)")
    from sheepop.interop.gguf_export import export_gguf
    notes = export_gguf(args.run_dir, args.out_dir, args.gguf_type)
    for note in notes:
        print(f"sheepop: note: {note}", file=sys.stderr)
    print(f"wrote a GGUF Llama model ({args.gguf_type}) to {args.out_dir}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sheepop.errors import UserError
    if not Path(args.hf_dir).exists():
        raise UserError(f"model not found: {args.hf_dir} (give a .gguf file or a Hugging Face "
                        "model directory)")
    if Path(args.run_dir, "config.json").exists() and not args.overwrite:
        raise UserError(f"{args.run_dir} already holds a run (use --overwrite to replace it, or "
                        "choose a new RUN_DIR)")
    if Path(args.hf_dir).is_dir():
        from sheepop.interop import import_hf
        cfg, arch = import_hf(args.hf_dir, args.run_dir, overwrite=args.overwrite)
    else:  # a file: GGUF, which its first bytes must say (a missing path is refused there too)
        from sheepop.interop.gguf import import_gguf
        cfg, arch = import_gguf(args.hf_dir, args.run_dir, overwrite=args.overwrite)
    m = cfg.model
    heads = f"{m.n_head} heads" + (f" ({m.kv_heads} key/value)" if m.kv_heads != m.n_head
                                   else "")
    print(f"imported {arch.name} ({m.n_layer} layers, {heads}, width {m.n_embd}, context "
          f"{m.block_size}, vocabulary {m.vocab_size}) into {args.run_dir}")
    _say_sampling(args.run_dir)
    return 0


def _say_sampling(run_dir: str) -> None:
    """What the model's generation_config.json set (the run's [sample]), and what it asked that
    sheepop does not do, as the import recorded them."""
    from sheepop.checkpoint import format as checkpoint
    generation = checkpoint.load_config(run_dir).get("source", {}).get("generation_config")
    if generation is None:
        return
    read = generation["read"]
    if read:
        listed = ", ".join(f"{k} {v}" for k, v in read.items())
        print(f"sampling from the model's generation_config.json: {listed} (the run's "
              f"[sample]; a flag of generate, chat or serve overrides it)")
    for note in generation["notes"]:
        print(f"sheepop: note: {note}", file=sys.stderr)
