"""What an export to GPT-2 or Llama checks first: the settings of sheepop's models that neither
architecture has (a bias on the output head, and the modern recipe's normalised queries and
keys, value embeddings, U-net skips and capped logits), and the refusal that names the first
setting a format cannot hold. Each format's own checks (its positions, norm, feed-forward):
check_gpt2_shaped (gpt2.py), check_llama_shaped (llama.py)."""

from __future__ import annotations

from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError

Check = tuple[bool, str]
"""(whether the model's setting fits the format, that setting and why it does not)."""


def settings_neither_has(cfg: ModelConfig, family: str) -> list[Check]:
    """The checks of the settings neither GPT-2 nor Llama has; `family` names the format in
    their reasons ("GPT-2", "Llama")."""
    return [
        (not cfg.head_bias, f"model.head_bias=true ({family}'s head has no bias)"),
        (not cfg.qk_norm, f"model.qk_norm=true ({family} does not normalise queries and keys)"),
        (not cfg.value_embeds, f"model.value_embeds={cfg.value_embeds} ({family}'s values come "
         "from the stream alone)"),
        (not cfg.unet_skips, f"model.unet_skips=true ({family} has no skips across blocks)"),
        (not cfg.logit_softcap, f"model.logit_softcap={cfg.logit_softcap:g} ({family}'s logits "
         "are not capped)"),
    ]


def refuse_first(checks: list[Check], family: str) -> None:
    """One UserError, "cannot export as FAMILY: SETTING (why)", for the first check that fails."""
    for ok, setting in checks:
        if not ok:
            raise UserError(f"cannot export as {family}: {setting}")
