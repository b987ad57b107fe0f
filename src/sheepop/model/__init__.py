"""The torch engine: the GPT of docs/architecture.md, each layer kind one unit (positions.py,
norm.py, ffn.py, attention.py), the whole model in gpt.py, generation in lm.py, LoRA adapters in
lora.py."""

from sheepop.model.gpt import GPT, cross_entropy
from sheepop.model.lm import TorchLM
from sheepop.model.lora import LoRALinear, adapter_weights, add_lora, merge_lora

__all__ = ["GPT", "LoRALinear", "TorchLM", "add_lora", "adapter_weights", "cross_entropy",
           "merge_lora"]
