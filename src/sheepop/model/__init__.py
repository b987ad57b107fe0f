"""The torch engine: the GPT of docs/architecture.md, each layer kind one unit (positions.py,
norm.py, ffn.py, attention.py), the whole model in gpt.py, generation in lm.py."""

from sheepop.model.gpt import GPT, cross_entropy
from sheepop.model.lm import TorchLM

__all__ = ["GPT", "TorchLM", "cross_entropy"]
