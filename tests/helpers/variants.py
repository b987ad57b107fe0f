"""The model variants the tests run, named once: the layer kinds as ModelConfig settings, to
merge into a test's own base shape (its sizes stay its own).

    ModelConfig(vocab_size=11, n_layer=2, n_head=4, n_embd=8, **llama(n_kv_head=2))

The modern decoder (Llama's choices against GPT-2's, docs/architectures.md) is rotary
positions, RMSNorm, SwiGLU, no biases and an untied head; each kind alone is a variant of its
own. The allowed values are the config's (sheepop.config.schema), so a renamed kind fails here
at import, not in one of the files that use it."""

from __future__ import annotations

from typing import Any

from sheepop.config.finetune import LORA_TARGETS
from sheepop.config.layer_kinds import GATE_ACTIVATION
from sheepop.config.schema import FFNS, NORMS, POS_ENCODINGS

ROPE = {"pos_encoding": "rope"}
RMSNORM = {"norm": "rmsnorm"}
SWIGLU = {"ffn": "swiglu", "activation": GATE_ACTIVATION["swiglu"]}  # (what its gate computes)
LLAMA = {**ROPE, **RMSNORM, **SWIGLU, "bias": False, "tie_weights": False}
ALL_LORA_TARGETS = LORA_TARGETS  # an adapter on every layer kind LoRA knows

assert ROPE["pos_encoding"] in POS_ENCODINGS and RMSNORM["norm"] in NORMS \
    and SWIGLU["ffn"] in FFNS


def gqa(n_head: int = 4, n_kv_head: int = 2) -> dict[str, int]:
    """Grouped-query attention: n_kv_head key/value heads shared by n_head query heads (1:
    multi-query)."""
    return {"n_head": n_head, "n_kv_head": n_kv_head}


def llama(**changes: Any) -> dict[str, Any]:
    """The modern decoder's settings, with `changes` (a test's tied head, its head count...)."""
    return {**LLAMA, **changes}


# One of each, for a test that runs every kind.
VARIANTS = {"gpt": {}, "rope": ROPE, "rmsnorm": RMSNORM, "swiglu": SWIGLU, "gqa": gqa(),
            "llama": llama(**gqa())}
