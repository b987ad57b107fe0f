"""The scratch engine: the GPT of docs/architecture.md in NumPy, every backward pass by hand.

Each layer is a forward/backward pair with an explicit cache: the elementary layers in
layers.py, one unit per layer kind the config chooses (positions.py, norm.py, attention.py,
ffn.py), the block in block.py, the whole model in gpt.py (one forward, with an optional KV
cache); adamw.py updates the parameters; lm.py generates; LoRA wraps the model in lora.py. No
torch anywhere: docs/derivations/ derives every gradient, one page per layer kind.
"""

from sheepop.scratch.adamw import AdamW, clip_grad_norm
from sheepop.scratch.gpt import GPT, gpt_backward, gpt_forward, new_cache
from sheepop.scratch.init import init_params, param_shapes
from sheepop.scratch.lm import NumpyLM

__all__ = ["GPT", "AdamW", "NumpyLM", "clip_grad_norm", "gpt_backward", "gpt_forward",
           "init_params", "new_cache", "param_shapes"]
