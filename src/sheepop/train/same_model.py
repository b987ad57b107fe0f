"""A resumed run keeps its model: `--resume` with a config that changes the model's shape or
kind is refused in words ("the run has 4 layers, the config asks for 6"), before the weights
are loaded into a model they do not fit (which would only name missing parameters).

What may change on resume: model.dropout, and model.block_size unless the positions are learned
(sinusoidal and rotary positions have no weights: a longer context is the same model).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.errors import UserError
from sheepop.words import plural

# field -> the noun it counts (the run has 4 layers) or, as "=NAME", what it is (width 128).
_WORDS = {"n_layer": "layer", "n_head": "head", "n_kv_head": "key/value head",
          "vocab_size": "token id", "n_embd": "=width", "d_ff": "=feed-forward width",
          "block_size": "=context"}


def changes(run: ModelConfig, asked: ModelConfig) -> list[str]:
    """'the run has 4 layers, the config asks for 6 (model.n_layer)' for each model field that
    differs, except those a resumed run may change."""
    free = {"dropout", "zero_init_proj"}  # (an initialisation: nothing of a trained model)
    if run.pos_encoding != "learned":
        free.add("block_size")
    out = []
    for f in dataclasses.fields(ModelConfig):
        derived = f.name in ("d_ff", "n_kv_head") and getattr(run, f.name) == getattr(
            asked, f.name) == 0  # both follow from fields reported on their own
        have, want = _effective(run, f.name), _effective(asked, f.name)
        if (f.name in free or derived or have == want
                or (f.name == "vocab_size" and 0 in (have, want))):
            continue
        out.append(f"the run has {_say(f.name, have)}, the config asks for "
                   f"{_bare(f.name, want)} (model.{f.name})")
    return out


def _effective(m: ModelConfig, name: str) -> Any:
    """The value a field stands for (0 for n_kv_head is n_head, 0 for d_ff the default)."""
    return {"n_kv_head": m.kv_heads, "d_ff": m.ffn_dim}.get(name, getattr(m, name))


def _say(name: str, value: Any) -> str:
    word = _WORDS.get(name)
    if word is None:
        return f"{name} = {value!r}"
    if word.startswith("="):
        return f"{word[1:]} {value}"
    return plural(value, word)


def _bare(name: str, value: Any) -> str:
    return str(value) if name in _WORDS else repr(value)


def check_same_model(run_dir: Path, asked: ModelConfig) -> None:
    """A UserError naming every change of the model against the run's saved config."""
    saved = checkpoint.load_config(run_dir)
    run = Config.from_saved(saved, str(run_dir / checkpoint.CONFIG_FILE)).model
    found = changes(run, asked)
    if found:
        raise UserError(f"--resume: {'; '.join(found)}: a run keeps its model (start a new run "
                        "with another --out to train a different one)")
