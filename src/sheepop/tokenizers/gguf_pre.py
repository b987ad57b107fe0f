"""`tokenizer.ggml.pre`: the name under which llama.cpp knows a pre-split rule, both ways.

llama.cpp does not read a pre-split regex from a GGUF file: it reads a name and looks up its own
regex list for it (src/llama-vocab.cpp, `llm_tokenizer_bpe`), refusing the whole file when it
does not know the name. So a name may be written only when the rule it stands for splits text
exactly as the tokenizer does. `PRE_TOKENIZERS` gives each name sheepop reads as the Hugging Face
pre-tokenizer that llama.cpp's regex list amounts to (each regex a Split in turn, then the byte
map); `bpe_pre_name` finds the name of a sheepop `bpe` tokenizer's pattern:

- `gpt2-exact` is GPT-2's regex, llama.cpp's "gpt-2" (its custom split of that regex also ends
  with GPT-2's final `\\s+`);
- `gpt2` and `gpt4` differ from "gpt-2" and "llama-bpe" (Llama 3's regex) only in counting
  combining marks (\\p{M}) as letters: text splits differently only at the edges of a run of
  marks, so the ids are the same whenever no token of the vocabulary joins (a part of) a mark
  with (a part of) anything else; then the name is written, otherwise refused naming the token;
- "llama-bpe" also makes llama.cpp take a word that is a token as that token (ignore_merges),
  which sheepop's BPE does only when the merges build every token from its own bytes: checked.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

from sheepop.errors import UserError

GPT2_RULE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_RULE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RULE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split(rule: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": rule}, "behavior": "Isolated", "invert": False}


def byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def _sequence(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": list(steps)}


_DIGITS_THEN_GPT2 = _sequence({"type": "Digits", "individual_digits": True}, byte_level(True))
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "gpt-2": byte_level(True),
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "llama-bpe": _sequence(_split(LLAMA3_RULE), byte_level(False)),
    "qwen2": _sequence(_split(QWEN2_RULE), byte_level(False)),
    "falcon": _sequence(_split(r"[\p{P}\$\+<=>\^~\|`]+"), _split(GPT2_RULE),
                        _split("[0-9][0-9][0-9]"), byte_level(False)),
    "default": _sequence(_split(r"[\p{P}\$\+<=>\^~\|]+"), _split(GPT2_RULE), _split(r"\p{N}+"),
                         _split("[0-9][0-9][0-9]"), byte_level(False)),
}
"""Each name llama.cpp knows (and sheepop reads) as the pre-tokenizer its regex list amounts to.
Export writes the first name of an equal rule, so every name it writes is llama.cpp's."""
ALIASES = {"llama3": "llama-bpe", "llama-v3": "llama-bpe",
           "gpt2": "gpt-2"}  # "gpt2": what sheepop wrote before it wrote only llama.cpp's names
IGNORE_MERGES = {"llama-bpe"}
_MARK_BLIND = {"gpt2": "gpt-2", "gpt4": "llama-bpe"}
"""sheepop's named patterns that equal a llama.cpp rule but for combining marks."""


def bpe_pre_name(tok: Any) -> str:
    """The `tokenizer.ggml.pre` name of a sheepop BPE tokenizer's pattern (module docstring);
    a pattern llama.cpp has no name for is refused."""
    from sheepop.tokenizers.pretokenize import pattern_name
    pattern = pattern_name(tok.pattern)
    if pattern == "gpt2-exact":
        return "gpt-2"
    if pattern not in _MARK_BLIND:
        raise UserError(f"this bpe tokenizer's pre-split pattern ({pattern}: {tok.pattern}) has "
                        "no llama.cpp pre-tokenizer name, so it has no GGUF form (gpt2-exact, "
                        "gpt2 and gpt4 have)")
    name = _MARK_BLIND[pattern]
    for i, token in enumerate(tok.tokens):
        if token is not None and _joins_a_mark(token):
            raise UserError(
                f"this bpe tokenizer's token {i} ({token!r}) joins a combining mark to another "
                f"character, which sheepop's {pattern} pattern allows and llama.cpp's "
                f"{name!r} splits apart, so it has no GGUF form (train it with --pattern "
                "gpt2-exact)")
    if name in IGNORE_MERGES:
        _check_tokens_are_their_own_bpe(tok, name)
    return name


def _check_tokens_are_their_own_bpe(tok: Any, name: str) -> None:
    for i, token in enumerate(tok.tokens):
        if token is None or len(token) < 2:
            continue
        try:
            word = token.decode("utf-8")
        except UnicodeDecodeError:
            continue  # never a whole word, so ignore_merges never meets it
        if tok.encode_word(word) != [i]:
            raise UserError(f"this bpe tokenizer's merges do not build token {i} ({token!r}) "
                            f"from its own bytes, and llama.cpp's {name!r} takes a word that "
                            "is a token whole, so it has no GGUF form")


def _joins_a_mark(token: bytes) -> bool:
    """Whether a token's bytes hold a part of a combining mark and a part of another character
    (a fragment of a character cut by the token's edge counts as whatever it may be)."""
    kinds = list(_unit_kinds(token))
    return any(may_mark and any(other for j, (_, other) in enumerate(kinds) if j != i)
               for i, (may_mark, _) in enumerate(kinds))


def _unit_kinds(token: bytes) -> list[tuple[bool, bool]]:
    """(may be a mark, may be something else) for each character or fragment of `token`."""
    units: list[tuple[bool, bool]] = []
    i = 0
    while i < len(token):
        n = _utf8_length(token[i])
        if n == 0:  # continuation bytes: the tail of a character begun before the token
            start = i
            while i < len(token) and _utf8_length(token[i]) == 0 and i - start < 3:
                i += 1
            units.append(_kinds_of_tail(token[start:i]))
            continue
        units.append(_kinds_of_prefix(token[i:i + n]))
        i += n
    return units


def _utf8_length(lead: int) -> int:
    """A UTF-8 sequence's length from its first byte; 0 for a continuation byte."""
    if lead < 0x80:
        return 1
    if lead < 0xC0:
        return 0
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


@lru_cache(maxsize=4096)
def _kinds_of_prefix(prefix: bytes) -> tuple[bool, bool]:
    """(may be a mark, may be something else) for a character whose UTF-8 form starts with
    `prefix` (the whole character, or its start cut by the token's end)."""
    n = _utf8_length(prefix[0])
    if len(prefix) == n:
        try:
            is_mark = unicodedata.category(prefix.decode("utf-8")).startswith("M")
        except UnicodeDecodeError:
            return True, True
        return is_mark, not is_mark
    missing = n - len(prefix)
    low, high = _code_point(prefix + b"\x80" * missing), _code_point(prefix + b"\xbf" * missing)
    if low > 0x10FFFF:  # no character's form starts so
        return True, True
    return _kinds_of(range(low, min(high, 0x10FFFF) + 1))


@lru_cache(maxsize=4096)
def _kinds_of_tail(tail: bytes) -> tuple[bool, bool]:
    """(may be a mark, may be something else) for a character whose UTF-8 form ends with the
    continuation bytes `tail` (its start cut by the token's start)."""
    low_bits, step = 0, 1 << 6 * len(tail)  # the tail spells the code point's low bits
    for byte in tail:
        low_bits = low_bits << 6 | byte & 0x3F
    first = (0x80, 0x800, 0x10000)[len(tail) - 1]  # the smallest character with such a tail
    return _kinds_of(range(first + (low_bits - first) % step, 0x110000, step))


def _kinds_of(codes: range) -> tuple[bool, bool]:
    marks = others = False
    for code in codes:
        if unicodedata.category(chr(code)).startswith("M"):
            marks = True
        else:
            others = True
        if marks and others:
            break
    return marks, others


def _code_point(form: bytes) -> int:
    """The code point a UTF-8 form spells (overlong forms too: only its bits are read)."""
    code = form[0] & (0x7F >> len(form)) if len(form) > 1 else form[0]
    for byte in form[1:]:
        code = code << 6 | byte & 0x3F
    return code
