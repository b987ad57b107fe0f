"""Loading a trained run for inference: config, tokenizer and the model in either engine."""

from __future__ import annotations

from pathlib import Path

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


def language_model(cfg: Config, weights: dict, engine: str = "torch", device: str = "auto"):
    """A `sheepop.generate.LanguageModel` for the run, in the chosen engine."""
    if engine == "numpy":
        from sheepop.scratch.infer import NumpyLM
        return NumpyLM(cfg.model, weights)
    from sheepop.model import GPT
    from sheepop.model.infer import TorchLM
    from sheepop.train.engine_torch import resolve_device
    model = GPT(cfg.model)
    model.load_numpy_weights(weights)
    return TorchLM(model.to(resolve_device(device)))
