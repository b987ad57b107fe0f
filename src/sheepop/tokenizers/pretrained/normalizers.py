"""Normalizers of a Hugging Face tokenizer.json: text -> text, before anything is split.

Each is a function of the whole piece of text (the text between added tokens), as `tokenizers`
applies them: NFC / NFD / NFKC / NFKD (Unicode normal forms), Lowercase (each character on its
own: no final-sigma rule, as Rust's `char::to_lowercase`), Strip (Unicode White_Space at either
end), Replace (a literal String or a Regex, every match), Prepend (only to non-empty text),
ByteLevel (each UTF-8 byte as GPT-2's printable character) and Sequence. BertNormalizer,
StripAccents, NMT and Precompiled (SentencePiece's compiled rules) are refused by name.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from functools import partial
from typing import Any

import regex

from sheepop.tokenizers.pretokenize import bytes_to_unicode
from sheepop.tokenizers.pretrained.spec import Spec, pattern_regex, sequence

Normalize = Callable[[str], str]

_LEADING_SPACE = regex.compile(r"^\s+")
_TRAILING_SPACE = regex.compile(r"\s+$")


def build_normalizer(data: Any, where: str) -> Normalize | None:
    """The normalizer described by `data` (tokenizer.json's "normalizer"), None for none."""
    if data is None:
        return None
    spec = Spec(data, where)
    kind = spec.type
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        step: Normalize = partial(unicodedata.normalize, kind)
    elif kind == "Lowercase":
        step = _lowercase
    elif kind == "Strip":
        step = partial(_strip, spec.get("strip_left", bool, False),
                       spec.get("strip_right", bool, False))
    elif kind == "Replace":
        step = partial(_replace, pattern_regex(spec), spec.get("content", str))
    elif kind == "Prepend":
        step = partial(_prepend, spec.get("prepend", str))
    elif kind == "ByteLevel":
        step = _byte_level
    elif kind == "Sequence":
        steps = [build_normalizer(item, f"{where}[{k}]")
                 for k, item in enumerate(sequence(spec, "normalizers"))]
        step = partial(_chain, [s for s in steps if s is not None])
    else:
        raise spec.error("this normalizer is not supported (sheepop reads NFC, NFD, NFKC, NFKD, "
                         "Lowercase, Strip, Replace, Prepend, ByteLevel, Sequence)")
    spec.done()
    return step


def _chain(steps: list[Normalize], text: str) -> str:
    for step in steps:
        text = step(text)
    return text


def _lowercase(text: str) -> str:
    return text.lower() if text.isascii() else "".join(c.lower() for c in text)


def _strip(left: bool, right: bool, text: str) -> str:
    if left:
        text = _LEADING_SPACE.sub("", text)
    if right:
        text = _TRAILING_SPACE.sub("", text)
    return text


def _replace(pattern: regex.Pattern, content: str, text: str) -> str:
    return pattern.sub(lambda _: content, text)


def _prepend(prefix: str, text: str) -> str:
    return prefix + text if text else text


def _byte_level(text: str) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8", "surrogatepass"))
