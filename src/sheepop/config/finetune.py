"""The settings of `sheepop finetune`, sections of the config like the others
(sheepop.config.schema): [finetune] (the loss's tokens) and [lora] (the adapters). The command
records them in its run's finetune.json and lora.json; `sheepop train` refuses them."""

from __future__ import annotations

from dataclasses import dataclass

from sheepop.config.setting import setting

TRAIN_ON = ("assistant", "all")  # the tokens the loss counts (sheepop.tokenizers.chat_format)
METHODS = ("sft", "dpo")  # imitation of conversations; preference pairs (sheepop.finetune.dpo)
# The layers that can get a LoRA adapter, by the short names a user types (sheepop.arch.lora).
LORA_TARGETS = ("qkv", "proj", "fc", "down")


@dataclass
class FinetuneConfig:
    """How `sheepop finetune` trains on conversations (recorded in its run's finetune.json)."""
    train_on: str = setting("assistant", "which tokens the loss counts: the assistant's, or all of "
                            "them", TRAIN_ON)
    method: str = setting("sft", "what the data teaches: sft, imitation of conversations; dpo, "
                          "a preference between two answers (JSON Lines {prompt | messages, "
                          "chosen, rejected}; docs/finetune.md)", METHODS)
    beta: float = setting(0.1, "dpo: beta of -log sigma(beta [(log pi(c) - log pi_ref(c)) - "
                          "(log pi(r) - log pi_ref(r))]), how far the policy may move from the "
                          "reference for a preference (> 0; docs/derivations/dpo.md)")
    val_data: str = setting("", "a file of held-out examples in DATA's form (conversations for "
                            "sft, pairs for dpo) to evaluate on; all of DATA then trains (no "
                            "data.val_fraction split)")


@dataclass
class LoraSettings:
    """The adapters `sheepop finetune` trains, W + (alpha / r) B A (docs/finetune.md): the one
    place LoRA's settings and their defaults live. `sheepop.arch.lora.LoraConfig.for_run`
    resolves them for one model (what the engines' units take and the run's lora.json
    records)."""
    rank: int = setting(0, "rank r of the adapters W + (alpha/r) B A; 0: no adapters, every weight "
                        "trains (full fine-tuning)")
    alpha: float = setting(0.0, "the adapters' scale is alpha / rank (0: 2 * rank, a scale of 2)")
    targets: str = setting("qkv,proj", "comma-separated layers that get adapters, of {choices} "
                           "(qkv, proj: attention; fc: the FFN's first layer, swiglu's gate and "
                           "up; down: the FFN's output)", LORA_TARGETS, many=True)
    train_new_tokens: bool = setting(True, "the embedding (and head) rows of the chat tokens added "
                                     "to the vocabulary train with the adapters (false: frozen at "
                                     "their initial values)")

    @property
    def scale_alpha(self) -> float:
        """alpha, or its default 2r (a scale alpha / r of 2) when 0."""
        return self.alpha or 2.0 * self.rank

    @property
    def target_names(self) -> tuple[str, ...]:
        """The targets as a tuple of names, in the order typed ("qkv,fc" -> ("qkv", "fc"))."""
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())
