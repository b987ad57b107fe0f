"""Loading a trained run for inference: config, tokenizer and the model in either engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sheepop import checkpoint
from sheepop.config import Config
from sheepop.errors import UserError
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers import loads as load_tokenizer


def load_run(run_dir: str | Path) -> tuple[Config, Tokenizer, dict]:
    cfg = Config.from_dict({k: v for k, v in checkpoint.load_config(run_dir).items()
                            if k in ("model", "train", "data", "sample")})
    tokenizer = load_tokenizer(checkpoint.load_tokenizer_json(run_dir),
                               str(Path(run_dir) / checkpoint.TOKENIZER_FILE))
    weights = checkpoint.load_weights(run_dir)
    if tokenizer.vocab_size != cfg.model.vocab_size:
        raise UserError(f"{run_dir}: tokenizer has {tokenizer.vocab_size} ids but the model "
                        f"{cfg.model.vocab_size}")
    return cfg, tokenizer, weights


def never_generated(tokenizer: Tokenizer) -> list[int]:
    """Special tokens a model should never emit: padding, BOS and unknown (EOS stays: it ends
    generation). They never appear as training targets, but an undertrained model can still
    give them some probability."""
    return [i for i in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.unk_id) if i is not None]


class SuppressTokens:
    """Wraps a `LanguageModel` so that the given ids get logit -inf (probability 0)."""

    def __init__(self, lm, ids: list[int]):
        self.lm, self.ids = lm, list(ids)
        self.block_size = lm.block_size

    @property
    def cache_length(self) -> int:
        return self.lm.cache_length

    def _mask(self, logits: np.ndarray) -> np.ndarray:
        if self.ids:
            logits = np.array(logits, copy=True)
            logits[..., self.ids] = -np.inf
        return logits

    def prefill(self, ids):
        return self._mask(self.lm.prefill(ids))

    def decode(self, token: int):
        return self._mask(self.lm.decode(token))

    def full(self, ids):
        return self._mask(self.lm.full(ids))


def language_model(cfg: Config, weights: dict, engine: str = "torch", device: str = "auto",
                   suppress: list[int] | None = None):
    """A `sheepop.generate.LanguageModel` for the run, in the chosen engine; `suppress` ids
    are never generated."""
    if engine == "numpy":
        from sheepop.scratch.infer import NumpyLM
        lm = NumpyLM(cfg.model, weights)
    else:
        from sheepop.model import GPT
        from sheepop.model.infer import TorchLM
        from sheepop.train.engine_torch import resolve_device
        model = GPT(cfg.model)
        model.load_numpy_weights(weights)
        lm = TorchLM(model.to(resolve_device(device)))
    return SuppressTokens(lm, suppress) if suppress else lm
