"""The torch engine's side of the shared generation loop (`sheepop.generate.LanguageModel`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sheepop.model.gpt import GPT


class TorchLM:
    """Next-token logits from a `GPT`, with its preallocated KV cache, under inference_mode."""

    def __init__(self, model: GPT):
        self.model = model.eval()
        self.block_size = model.cfg.block_size
        self.device = next(model.parameters()).device
        self.cache = model.new_cache(batch=1)

    @property
    def cache_length(self) -> int:
        return self.cache.length

    def _run(self, ids: Sequence[int], cache) -> np.ndarray:
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits, _ = self.model(x, cache=cache, last_only=True)
        return logits[0, -1].float().cpu().numpy()

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        self.cache.reset()
        return self._run(ids, self.cache)

    def decode(self, token: int) -> np.ndarray:
        return self._run([token], self.cache)

    def full(self, ids: Sequence[int]) -> np.ndarray:
        return self._run(ids, None)
