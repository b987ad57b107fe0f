"""Hugging Face interop: GPT-2- and Llama-shaped models to and from `transformers`.

    export_hf("runs/my-run", "hf/my-model", "hf-llama")   # then from_pretrained works
    import_hf("hf/llama", "runs/llama")                   # then `sheepop generate` works
    export_gpt2 / import_gpt2, export_llama / import_llama: one architecture each
"""

from sheepop.interop.gpt2 import check_gpt2_shaped
from sheepop.interop.hf import (
    ARCHITECTURES,
    export_gpt2,
    export_hf,
    export_llama,
    import_gpt2,
    import_hf,
    import_llama,
)
from sheepop.interop.llama import check_llama_shaped

__all__ = ["ARCHITECTURES", "check_gpt2_shaped", "check_llama_shaped", "export_gpt2",
           "export_hf", "export_llama", "import_gpt2", "import_hf", "import_llama"]
