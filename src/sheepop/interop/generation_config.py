"""A Hugging Face model's generation_config.json: the sampling its authors chose, as the run's
[sample] settings (they replace sheepop's defaults; a flag of generate, chat or serve still wins).

transformers' GenerationConfig has some sixty fields. Each one that changes what is drawn is
either honoured or named in a note, never dropped without a word:

    do_sample                   false: greedy (sample.temperature = 0); true: the settings below
    temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens
                                sample.<the same name>: transformers' rule is sheepop's
                                (temperature first, then top-k, top-p, min-p; the penalty on
                                every token already in the context: sheepop.generation.sample)
    eos_token_id                the ids that end generation: the tokenizer's EOS (and, in chat,
                                the end of a turn) do; any other id is named in a note

A field that cannot change the tokens drawn (the ids of BOS and padding, caching, what
transformers returns, its version) is read as nothing; so is a field that holds the value asking
for nothing (num_beams 1, typical_p 1.0, no_repeat_ngram_size 0, ...: INERT). Any other field
(beam search, typical-p, epsilon and eta cut-offs, n-gram bans, forced or suppressed tokens,
max_length, min_new_tokens, ...) is not used, and a note says so by name. A value of the wrong
type or out of range is refused in one line: the file is the model's and must be right.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sheepop.config.schema import Config
from sheepop.errors import UserError
from sheepop.files import read_json, shown

FILE = "generation_config.json"
# Fields that are the run's [sample] keys of the same name and meaning.
SAMPLE_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens")
# Fields that never change which tokens are drawn.
NOT_SAMPLING = frozenset({
    "bos_token_id", "pad_token_id", "decoder_start_token_id", "transformers_version",
    "_from_model_config", "use_cache", "cache_implementation", "cache_config",
    "return_dict_in_generate", "output_attentions", "output_hidden_states", "output_scores",
    "output_logits", "num_return_sequences", "max_time", "low_memory", "trust_remote_code",
    "compile_config", "disable_compile"})
# Fields that change the draw, at the values that ask for nothing (transformers' own defaults).
INERT = {"num_beams": (1,), "num_beam_groups": (1,), "typical_p": (1.0,), "epsilon_cutoff": (0.0,),
         "eta_cutoff": (0.0,), "no_repeat_ngram_size": (0,), "encoder_no_repeat_ngram_size": (0,),
         "length_penalty": (1.0,), "diversity_penalty": (0.0,), "min_length": (0,),
         "min_new_tokens": (0,), "encoder_repetition_penalty": (1.0,),
         "renormalize_logits": (False,),
         "penalty_alpha": (), "guidance_scale": (1.0,), "early_stopping": (False,),
         "top_n_sigma": (), "remove_invalid_values": (False,), "bad_words_ids": ([],),
         "suppress_tokens": ([],), "begin_suppress_tokens": ([],), "forced_bos_token_id": (),
         "forced_eos_token_id": (), "sequence_bias": ({},), "stop_strings": ([],),
         "max_length": (), "force_words_ids": ([],), "constraints": ([],),
         "exponential_decay_length_penalty": ()}


def read_generation_config(hf_dir: Path) -> dict[str, Any] | None:
    """The directory's generation_config.json as a dict, or None when it has none."""
    path = hf_dir / FILE
    if not path.is_file():
        return None
    data = read_json(path, what=FILE)
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object")
    return data


def apply_generation_config(data: dict[str, Any], cfg: Config, eos_id: int | None,
                            where: str) -> tuple[dict[str, Any], list[str]]:
    """Set `cfg.sample` from generation_config.json's `data`: the fields taken ({name: value})
    and a note for each field that changes the draw and is not used (UserError: a bad value)."""
    taken: dict[str, Any] = {}
    notes = []
    for key, value in data.items():
        if value is None or key in NOT_SAMPLING:
            continue
        if key in SAMPLE_FIELDS:
            cfg.set(f"sample.{key}", value, where)
            taken[key] = value
        elif key == "do_sample":
            if type(value) is not bool:
                raise UserError(f"{where}: do_sample must be true or false, not {shown(value)}")
            taken[key] = value
        elif key == "eos_token_id":
            ids = value if isinstance(value, list) else [value]
            if not ids or any(type(i) is not int for i in ids):
                raise UserError(f"{where}: eos_token_id must be a token id or a list of them, "
                                f"not {shown(value)}")
            others = [i for i in ids if i != eos_id]
            if others:
                notes.append(f"{FILE}: eos_token_id {shown(value)} also ends an answer in "
                             f"transformers; sheepop ends one at the tokenizer's EOS "
                             f"({eos_id}) and, in chat, at the end of a turn or any special "
                             f"token")
        elif not any(type(value) is type(i) and value == i for i in INERT.get(key, ())):
            notes.append(f"{FILE}: {key} = {shown(value)} is not used (sheepop's sampling: "
                         f"temperature, top-k, top-p, min-p, repetition penalty)")
    if taken.get("do_sample") is False:
        cfg.sample.temperature = 0.0  # transformers' greedy search
    try:
        cfg.validate()
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    return taken, notes
