"""The rules a configuration must satisfy (`Config.validate`): one UserError, for the first
impossible value: a choice not in its list, a number out of its range (NaN and infinity
included), or a model too big for this machine (`sheepop.config.model_size`, checked
last, once every size is known to be positive)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from sheepop.config.model_size import check_model_size, physical_memory
from sheepop.errors import UserError
from sheepop.files import shown


def check_config(cfg: Any, sections: dict[str, type]) -> None:
    """Raise a UserError for the first value of `cfg` (a sheepop.config.schema.Config, whose
    section classes are `sections`; schema imports this module, so the type is not named here)
    that breaks a rule."""
    m, t, d, s, lora = cfg.model, cfg.train, cfg.data, cfg.sample, cfg.lora
    values = [(f"{section}.{f.name}", getattr(getattr(cfg, section), f.name), f)
              for section, cls in sections.items() for f in fields(cls)]
    checks = [(all(v in f.metadata["choices"] for v in _listed(value, f.metadata["many"])),
               f"{name} must be {'a comma-separated list of' if f.metadata['many'] else 'one of'}"
               f" {', '.join(f.metadata['choices'])}, not {shown(value)}")
              for name, value, f in values if f.metadata["choices"]]
    checks += [(math.isfinite(value), f"{name} must be a finite number, not {value}")
               for name, value, _ in values if isinstance(value, float)]
    checks += [
        (m.vocab_size >= 0, "model.vocab_size must be >= 0 (0: taken from the tokenizer)"),
        (m.logit_softcap >= 0, "model.logit_softcap must be >= 0 (0: off)"),
        (m.n_layer >= 1, "model.n_layer must be at least 1"),
        # After n_layer's own rule: a bad n_layer is named as such, not as a table count.
        (m.value_embeds == 0 or 0 <= 2 * m.value_embeds <= m.n_layer,
         f"model.value_embeds must be 0 to n_layer / 2 ({max(m.n_layer, 0) // 2}): the first N "
         f"layers and the last N read the tables, not {m.value_embeds}"),
        (m.n_head >= 1, "model.n_head must be at least 1"),
        (m.n_embd >= 1, "model.n_embd must be at least 1"),
        (m.n_head >= 1 and m.n_embd % m.n_head == 0,
         f"model.n_embd ({m.n_embd}) must be divisible by model.n_head ({m.n_head})"),
        (m.n_kv_head >= 0, "model.n_kv_head must be >= 0 (0: n_head)"),
        (m.n_head >= 1 and m.n_kv_head >= 0 and m.n_head % m.kv_heads == 0,
         f"model.n_head ({m.n_head}) must be divisible by model.n_kv_head ({m.n_kv_head})"),
        (m.pos_encoding not in ("rope", "rope_terms", "rope_places")
         or (m.n_head >= 1 and m.n_embd % m.n_head == 0 and m.head_dim % 2 == 0),
         f"rope rotates pairs: the head width n_embd / n_head ({m.n_embd} / {m.n_head}) "
         "must be even"),
        (m.pos_encoding != "rope_places" or m.n_head < 1 or m.head_dim % 4 == 0,
         f"rope_places turns half the pairs by term index and half by digit place: the head "
         f"width n_embd / n_head ({m.n_embd} / {m.n_head}) must be a multiple of 4"),
        (m.rope_theta > 1, f"model.rope_theta must be > 1, not {m.rope_theta}"),
        (m.block_size >= 1, "model.block_size must be at least 1"),
        (m.d_ff >= 0, "model.d_ff must be >= 0"),
        (0.0 <= m.dropout < 1.0, "model.dropout must be in [0, 1)"),
        (m.pos_encoding != "sinusoidal" or m.n_embd % 2 == 0,
         "model.n_embd must be even for sinusoidal positions"),
        (m.ln_eps > 0, "model.ln_eps must be positive"),
        (m.pos_scale >= 0, "model.pos_scale must be >= 0 (0: 1/sqrt(n_embd))"),
        (min(m.digit_positions, m.digit_offset, m.term_positions) >= 0,
         "model.digit_positions, digit_offset and term_positions must be >= 0"),
        (m.digit_positions == 0 or m.digit_offset <= m.digit_positions - 2,
         f"model.digit_offset ({m.digit_offset}) leaves no row for a digit: it must be at most "
         f"model.digit_positions - 2 ({m.digit_positions - 2})"),
        ((m.digit_positions == m.term_positions == 0
          and m.pos_encoding not in ("rope_terms", "rope_places"))
         or d.tokenizer == "digits",
         f"model.digit_positions, term_positions and pos_encoding=rope_terms or rope_places "
         f"need the digits "
         f"tokenizer (ids 0-9 are the digits), not data.tokenizer={d.tokenizer}"),
        (t.steps >= 1, "train.steps must be at least 1"),
        (t.batch_size >= 1, "train.batch_size must be at least 1"),
        (t.grad_accum >= 1, "train.grad_accum must be at least 1"),
        (t.lr > 0 and t.min_lr >= 0, "train.lr must be positive and train.min_lr >= 0"),
        (t.warmup_steps >= 0 and t.decay_steps >= 0, "warmup/decay steps must be >= 0"),
        (0 < t.cooldown <= 1, f"train.cooldown must be in (0, 1], not {t.cooldown}"),
        (t.target_val_loss >= 0, "train.target_val_loss must be >= 0 (0: off)"),
        (t.eval_batches >= 1, "train.eval_batches must be at least 1"),
        (0 <= t.beta1 < 1 and 0 <= t.beta2 < 1, "train.beta1 and beta2 must be in [0, 1)"),
        (t.eps > 0, "train.eps must be positive"),
        (t.muon_lr > 0 and 0 <= t.muon_momentum < 1,
         "train.muon_lr must be positive and train.muon_momentum in [0, 1)"),
        (1 <= t.muon_ns_steps <= 20, "train.muon_ns_steps must be in [1, 20]"),
        (t.optimizer != "muon" or not t.fsdp, "train.optimizer=muon orthogonalises whole "
         "matrices, which train.fsdp shards over the ranks: use DDP (fsdp=false) with Muon"),
        (min(t.weight_decay, t.grad_clip, t.max_minutes) >= 0,
         "train.weight_decay, grad_clip and max_minutes must be >= 0"),
        (min(t.eval_interval, t.checkpoint_interval, t.threads) >= 0,
         "train.eval_interval, checkpoint_interval and threads must be >= 0"),
        (0 <= t.seed < 2**63, "train.seed must be in [0, 2^63)"),
        (-1 <= s.seed < 2**63, "sample.seed must be in [0, 2^63), or -1 for a fresh one each "
                               "time"),
        (t.log_interval >= 1, "train.log_interval must be at least 1"),
        (t.keep_last >= 1, "train.keep_last must be at least 1 (the latest checkpoint)"),
        (t.early_stop_patience >= 0, "train.early_stop_patience must be >= 0 (0: never)"),
        (t.max_grad_norm >= 0, "train.max_grad_norm must be >= 0 (0: no limit)"),
        (0.0 <= d.val_fraction < 1.0, "data.val_fraction must be in [0, 1)"),
        (d.stride >= 0, "data.stride must be >= 0"),
        (d.vocab_size >= 0, "data.vocab_size must be >= 0 (0: the kind's default)"),
        (d.max_bytes >= 1, "data.max_bytes must be at least 1"),
        (s.max_new_tokens >= 0, f"sample.max_new_tokens must be >= 0, not {s.max_new_tokens}"),
        (s.temperature >= 0, f"sample.temperature must be >= 0 (0: greedy), not "
                             f"{s.temperature}"),
        (s.top_k >= 0, f"sample.top_k must be >= 0 (0: off), not {s.top_k}"),
        (0 < s.top_p <= 1, f"sample.top_p must be in (0, 1] (1: off), not {s.top_p}"),
        (0 <= s.min_p <= 1, f"sample.min_p must be in [0, 1] (0: off), not {s.min_p}"),
        (s.repetition_penalty > 0, f"sample.repetition_penalty must be > 0 (1: off), not "
                                   f"{s.repetition_penalty}"),
        (s.slide_chunk >= 0, f"sample.slide_chunk must be >= 0 (0: block_size // 4), not "
                             f"{s.slide_chunk}"),
        (0 <= s.speculate <= 64, f"sample.speculate must be 0 to 64 (0: off), not "
                                 f"{s.speculate}"),
        (lora.rank >= 0, f"lora.rank must be >= 0 (0: full fine-tuning), not {lora.rank}"),
        (lora.rank == 0 or t.optimizer != "muon", "train.optimizer=muon trains whole matrices; "
         "LoRA's adapters (lora.rank > 0) train with adamw"),
        (lora.alpha >= 0, f"lora.alpha must be >= 0 (0: 2 * lora.rank), not {lora.alpha}"),
        (lora.rank > 0 or (lora.alpha == 0 and lora.train_new_tokens),
         "lora.alpha and lora.train_new_tokens need lora.rank (the adapters' rank)"),
    ]
    checks += cfg.rl.problems()  # sheepop rl's numbers (sheepop.config.rl)
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    check_model_size(m)
    # One (B, T, d) float32 activation of a micro-batch must fit in memory (a saved batch_size
    # of 10**12 once asked NumPy for 7.28 TiB before anything said why).
    if t.batch_size * m.block_size * m.n_embd * 4 > physical_memory():
        raise UserError(f"train.batch_size={t.batch_size} is too large: one micro-batch's "
                        "activations (batch_size x block_size x n_embd floats) would not fit "
                        "in this machine's memory")


def _listed(value: object, many: bool) -> list[object]:
    """A choice's value as the list of names it holds: "qkv,proj" -> ["qkv", "proj"] for a
    comma-separated one (at least one name: [""] for none, which no choice allows)."""
    if not many or not isinstance(value, str):
        return [value]
    return [name.strip() for name in value.split(",")]
