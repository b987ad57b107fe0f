"""One check that the KV cache is right for a model variant, in both engines: the logits of a
prompt fed in parts through the cache equal the full forward's, and torch's equal NumPy's."""

from __future__ import annotations

import numpy as np
import torch

from sheepop.config.schema import ModelConfig
from sheepop.model import GPT
from sheepop.scratch import gpt_forward
from sheepop.scratch.gpt import new_cache


def assert_the_cache_gives_the_full_forward(w: dict[str, np.ndarray], cfg: ModelConfig,
                                            x: np.ndarray, prompt: int = 5) -> np.ndarray:
    """x's first `prompt` tokens at once, then one at a time through each engine's KV cache,
    give that engine's full-forward logits, and the engines give each other's, all within 64
    float32 roundings of the largest logit (the same sums in another order). Returns NumPy's
    full-forward logits."""
    batch, length = x.shape
    full = gpt_forward(w, cfg, x)[0]
    cache = new_cache(cfg, batch)
    parts = [gpt_forward(w, cfg, x[:, :prompt], cache=cache)[0]]
    parts += [gpt_forward(w, cfg, x[:, t:t + 1], cache=cache)[0] for t in range(prompt, length)]
    bound = 64 * 2.0 ** -24 * np.abs(full).max()
    np.testing.assert_allclose(np.concatenate(parts, 1), full, rtol=0, atol=bound)
    model = GPT(cfg).eval()
    model.load_numpy_weights(w)
    ids = torch.from_numpy(x)
    with torch.no_grad():
        theirs = model(ids)[0]
        kv = model.new_cache(batch=batch)
        steps = [model(ids[:, :prompt], cache=kv)[0]]
        steps += [model(ids[:, t:t + 1], cache=kv)[0] for t in range(prompt, length)]
    np.testing.assert_allclose(torch.cat(steps, 1).numpy(), theirs.numpy(), rtol=0, atol=bound)
    np.testing.assert_allclose(theirs.numpy(), full, rtol=0, atol=bound)
    return full
