"""Interop: GPT-2- and Llama-shaped models to and from `transformers`, and GGUF (llama.cpp).

    export_hf("runs/my-run", "hf/my-model", "hf-llama")   # then from_pretrained works
    import_hf("hf/llama", "runs/llama")                   # then `sheepop generate` works
    export_gpt2 / import_gpt2, export_llama / import_llama: one architecture each
    import_gguf("model.gguf", "runs/model")               # llama or gpt2, any common quant
    export_gguf("runs/my-run", "my-model.gguf", "q8_0")   # then llama.cpp / Ollama run it
"""

from sheepop.interop.gguf import import_gguf
from sheepop.interop.gguf_export import export_gguf
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

__all__ = ["ARCHITECTURES", "check_gpt2_shaped", "check_llama_shaped", "export_gguf",
           "export_gpt2", "export_hf", "export_llama", "import_gguf", "import_gpt2", "import_hf",
           "import_llama"]
