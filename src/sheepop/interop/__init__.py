"""Hugging Face interop: GPT-2-shaped models to and from `transformers`' GPT2LMHeadModel.

    from sheepop.interop import export_gpt2, import_gpt2
    export_gpt2("runs/my-run", "hf/my-model")     # then transformers' from_pretrained works
    import_gpt2("hf/gpt2", "runs/gpt2")           # then `sheepop generate runs/gpt2` works
"""

from sheepop.interop.gpt2 import check_gpt2_shaped
from sheepop.interop.hf import export_gpt2, import_gpt2

__all__ = ["check_gpt2_shaped", "export_gpt2", "import_gpt2"]
