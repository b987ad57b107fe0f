"""tokenizer_config.json, the file `transformers` reads beside tokenizer.json: which tokens are
the model's BOS / EOS / PAD / UNK, and the chat template.

Its add_bos_token / add_eos_token are not read: transformers 5 drops them whenever a
tokenizer.json is present (tokenization_utils_base.from_pretrained), so tokenizer.json's
post-processor alone decides which special ids surround a model input, here as there.

Fields that would change ids and that sheepop does not apply are refused by name:
`split_special_tokens: true` (special tokens encoded as text), `add_prefix_space: true`
(transformers rewrites the pre-tokenizer), special tokens that tokenizer.json lacks
(transformers would append them as new ids). `clean_up_tokenization_spaces` changes only
transformers' decoded text, never ids, and is not applied.
"""

from __future__ import annotations

from typing import Any

from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.tokenizers.pretrained.tokenizer import PretrainedTokenizer

ROLE_KEYS = {"bos": "bos_token", "eos": "eos_token", "pad": "pad_token", "unk": "unk_token"}


def from_hf_files(tokenizer_json: Any, tokenizer_config: Any, where: str,
                  config_where: str = "tokenizer_config.json") -> PretrainedTokenizer:
    """The tokenizer of a Hugging Face directory: tokenizer.json's content and the parsed
    tokenizer_config.json (None when the directory has none); `chat_template` (whatever its
    text) is kept on the result."""
    config = {} if tokenizer_config is None else tokenizer_config
    if not isinstance(config, dict):
        raise UserError(f"{config_where}: must hold a JSON object")
    roles = {role: _token_name(config.get(key), f"{config_where}: {key}")
             for role, key in ROLE_KEYS.items()}
    if config.get("split_special_tokens"):
        raise UserError(f"{config_where}: 'split_special_tokens' is true (special tokens "
                        "encoded as plain text), which sheepop does not do")
    if config.get("add_prefix_space"):
        raise UserError(f"{config_where}: 'add_prefix_space' is true; sheepop applies the "
                        "pre-tokenizer of tokenizer.json as written (set its add_prefix_space "
                        "there)")
    tok = PretrainedTokenizer(tokenizer_json, roles, where=where)
    _check_listed_tokens(tok, config, config_where)
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    if template is not None and not isinstance(template, str):
        raise UserError(f"{config_where}: 'chat_template' must be a string")
    tok.chat_template = template
    return tok


def _token_name(value: Any, where: str) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise UserError(f"{where}: must be a token string, not {shown(value)}")
    return value


def _check_listed_tokens(tok: PretrainedTokenizer, config: dict[str, Any], where: str) -> None:
    """Tokens tokenizer_config.json names must be tokenizer.json's, with the same ids."""
    listed = config.get("added_tokens_decoder") or {}
    if not isinstance(listed, dict):
        raise UserError(f"{where}: 'added_tokens_decoder' must be an object")
    for key, entry in listed.items():
        name = _token_name(entry, f"{where}: added_tokens_decoder")
        if not str(key).isdigit() or name is None or tok.token_to_id(name) != int(key):
            raise UserError(f"{where}: added_tokens_decoder gives {shown(name)} the id "
                            f"{shown(key)}, which tokenizer.json does not")
    for key in ("additional_special_tokens", "extra_special_tokens"):
        names = config.get(key) or []
        for name in names if isinstance(names, list) else []:
            name = _token_name(name, f"{where}: {key}")
            if name is not None and tok.token_to_id(name) is None:
                raise UserError(f"{where}: the {key[:-7].replace('_', ' ')} token {name!r} is "
                                "not in tokenizer.json (transformers would add a new id)")
