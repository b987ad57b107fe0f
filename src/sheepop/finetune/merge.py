"""`sheepop export LORA_RUN OUT_DIR --merge-lora`: a LoRA run as a plain run; and
`--to FORMAT --adapters`: the base model and the adapters for Hugging Face and PEFT.

Every adapted weight becomes W + (alpha / r) B A (sheepop.arch.lora.merge, through
sheepop.inference.load.read_run), every other weight is the base run's (grown to the chat tokens),
and the result is an ordinary run directory: config, tokenizer, one weights file, no lora.json,
no reference to the base run. Its logits equal the adapted model's (up to float32 rounding of
the sum), which tests/finetune checks in both engines.
"""

from __future__ import annotations

from pathlib import Path

from sheepop.arch.lora import LoraConfig
from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError
from sheepop.inference.load import read_run


def write_merged(run_dir: str | Path, out_dir: str | Path) -> None:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if LoraConfig.load(run_dir) is None:
        raise UserError(f"{run_dir} has no LoRA adapters (no lora.json): it is a plain run "
                        "already")
    if checkpoint.holds_checkpoint(out_dir):
        raise UserError(f"{out_dir} already holds a run: choose another OUT_DIR")
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"output path exists and is not a directory: {out_dir}")
    cfg, _, weights = read_run(run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.save_checkpoint(out_dir, weights, cfg.to_dict(),
                               checkpoint.load_tokenizer_json(run_dir))


def export_with_adapters(run_dir: str | Path, out_dir: str | Path, format: str) -> list[str]:
    """`sheepop export LORA_RUN OUT_DIR --to FORMAT --adapters`: the base model (grown to the
    run's tokenizer, unmerged) as a Hugging Face directory in OUT_DIR and the adapters in the
    PEFT layout in OUT_DIR/adapter, for `peft.PeftModel.from_pretrained(model, OUT_DIR/adapter)`.
    Returns the notes of the export."""
    import tempfile

    from sheepop.inference.load import grown_for
    from sheepop.interop.hf import export_hf
    from sheepop.interop.peft import export_peft
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    lora = LoraConfig.load(run_dir)
    if lora is None:
        raise UserError(f"--adapters: {run_dir} has no LoRA adapters (no lora.json)")
    cfg, tokenizer, _ = read_run(run_dir)  # checks the run, its base and its adapters
    _, base_tokenizer, base_weights = read_run(lora.base_run)
    tokenizer_json = checkpoint.load_tokenizer_json(run_dir)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "base"
        checkpoint.save_checkpoint(plain, grown_for(base_weights, base_tokenizer, tokenizer),
                                   cfg.to_dict(), tokenizer_json)
        notes = export_hf(plain, out_dir, format)
    export_peft(checkpoint.load_weights(run_dir), lora, cfg.model, out_dir / "adapter", format,
                str(out_dir))
    return notes
