"""The scratch engine: the GPT of docs/architecture.md in NumPy, every backward pass by hand.

Each layer is a forward/backward pair with an explicit cache (layers.py, attention.py,
block.py); gpt.py chains them into the whole model; adamw.py updates the parameters; infer.py
generates with a KV cache. No torch anywhere: docs/backprop.md derives every gradient.
"""

from sheepop.scratch.adamw import AdamW, clip_grad_norm
from sheepop.scratch.gpt import GPT, gpt_backward, gpt_forward
from sheepop.scratch.infer import KVCache, NumpyLM, forward_cached
from sheepop.scratch.init import init_params, param_shapes

__all__ = ["GPT", "AdamW", "KVCache", "NumpyLM", "clip_grad_norm", "forward_cached",
           "gpt_backward", "gpt_forward", "init_params", "param_shapes"]
