"""Pre-tokenizers of a Hugging Face tokenizer.json: normalized text -> the words BPE sees.

A pre-tokenizer cuts every piece it is given into smaller pieces; the model then encodes each
piece on its own (merges never cross a cut). Each step here receives the list of pieces and
whether the first one starts the original text (Metaspace's "first" scheme needs it) and returns
the same for its output, as `tokenizers` chains them in a Sequence.

Splitting by a pattern (`split_by`) follows `tokenizers`: the text becomes its matches and the
gaps between them (with `invert`, the gaps are the matches), then the behaviour decides:
Removed drops the matches; Isolated keeps each as its own piece; MergedWithPrevious glues a match
to the piece before it and MergedWithNext to the piece after it (a match right after another
match stands alone); Contiguous joins runs of adjacent matches. Empty pieces are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import regex

from sheepop.tokenizers.pretokenize import PATTERNS, bytes_to_unicode
from sheepop.tokenizers.pretrained.spec import Spec, one_char, pattern_regex, sequence

Pieces = list[str]
PreTokenize = Callable[[Pieces, bool], tuple[Pieces, bool]]
"""(pieces, first piece starts the text) -> the same after this step."""

BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")
GPT2_SPLIT = regex.compile(PATTERNS["gpt2-exact"])
"""ByteLevel's own split with use_regex: OpenAI's GPT-2 rule."""
_NUMERIC = regex.compile(r"\p{N}")  # Rust's char::is_numeric: Nd, Nl, No
_WORDS = regex.compile(r"\w+|[^\w\s]+")
_SPACE = regex.compile(r"\s")
# Rust's is_ascii_punctuation or a Unicode punctuation category (P*).
_PUNCTUATION = regex.compile(r"[\p{P}!-/:-@\[-`{-~]")
# Each byte -> GPT-2's printable character, as a str.translate table over the Latin-1 reading.
_BYTE_CHARS = {b: c for b, c in bytes_to_unicode().items()}


def build_pre_tokenizer(data: Any, where: str) -> PreTokenize | None:
    """The pre-tokenizer described by `data` (tokenizer.json's "pre_tokenizer"), or None."""
    if data is None:
        return None
    spec = Spec(data, where)
    kind = spec.type
    if kind == "ByteLevel":
        spec.ignore("trim_offsets")
        prefix = spec.get("add_prefix_space", bool, True)
        use_regex = spec.get("use_regex", bool, True)
        step: PreTokenize = partial(_each, partial(_byte_level, prefix, use_regex))
    elif kind == "Split":
        step = partial(_each, partial(split_by, pattern_regex(spec), _behavior(spec),
                                      spec.get("invert", bool, False)))
    elif kind == "Digits":
        contiguous = "Isolated" if spec.get("individual_digits", bool, False) else "Contiguous"
        step = partial(_each, partial(split_by, _NUMERIC, contiguous, False))
    elif kind == "Metaspace":
        step = _metaspace(spec)
    elif kind == "Whitespace":
        step = partial(_each, partial(split_by, _WORDS, "Removed", True))
    elif kind == "WhitespaceSplit":
        step = partial(_each, partial(split_by, _SPACE, "Removed", False))
    elif kind == "Punctuation":
        step = partial(_each, partial(split_by, _PUNCTUATION, _behavior(spec, "Isolated"), False))
    elif kind == "BertPreTokenizer":
        step = partial(_chain, [partial(_each, partial(split_by, _SPACE, "Removed", False)),
                                partial(_each, partial(split_by, _PUNCTUATION, "Isolated", False))])
    elif kind == "CharDelimiterSplit":
        delimiter = regex.compile(regex.escape(one_char(spec, "delimiter")))
        step = partial(_each, partial(split_by, delimiter, "Removed", False))
    elif kind == "Sequence":
        steps = [build_pre_tokenizer(item, f"{where}[{k}]")
                 for k, item in enumerate(sequence(spec, "pretokenizers"))]
        step = partial(_chain, [s for s in steps if s is not None])
    else:
        raise spec.error("this pre-tokenizer is not supported (sheepop reads ByteLevel, Split, "
                         "Digits, Metaspace, Whitespace, WhitespaceSplit, Punctuation, "
                         "BertPreTokenizer, CharDelimiterSplit, Sequence)")
    spec.done()
    return step


def _behavior(spec: Spec, default: str | None = None) -> str:
    value = spec.get("behavior", str) if default is None else spec.get("behavior", str, default)
    if value not in BEHAVIORS:
        raise spec.error(f"'behavior' must be one of {', '.join(BEHAVIORS)}, not {value!r}")
    return value


def _chain(steps: list[PreTokenize], pieces: Pieces, at_start: bool) -> tuple[Pieces, bool]:
    for step in steps:
        pieces, at_start = step(pieces, at_start)
    return pieces, at_start


def _each(split: Callable[[str], tuple[Pieces, bool]], pieces: Pieces, at_start: bool
          ) -> tuple[Pieces, bool]:
    """Apply a one-piece split to every piece; the first output keeps `at_start` only when it
    still begins where the first input piece began."""
    out: Pieces = []
    first_at_start = False
    for k, piece in enumerate(pieces):
        parts, starts_at_zero = split(piece)
        if not out and parts:
            first_at_start = at_start and k == 0 and starts_at_zero
        out.extend(parts)
    return out, first_at_start


def split_by(pattern: regex.Pattern, behavior: str, invert: bool, text: str
             ) -> tuple[Pieces, bool]:
    """`text` cut by `pattern` under `behavior` (module docstring); and whether the first piece
    begins at offset 0 of `text`."""
    if behavior == "Isolated":  # the common case, fast when the matches cover the text
        found = pattern.findall(text)
        if sum(map(len, found)) == len(text) and found and isinstance(found[0], str):
            return [p for p in found if p], True
    parts: list[tuple[int, int, bool]] = []  # (start, end, is_match)
    prev = 0
    for m in pattern.finditer(text):
        start, end = m.span()
        if prev != start:
            parts.append((prev, start, invert))
        parts.append((start, end, not invert))
        prev = end
    if prev != len(text):
        parts.append((prev, len(text), invert))
    spans = _apply_behavior(parts, behavior)
    kept = [(s, e) for s, e in spans if e > s]
    return [text[s:e] for s, e in kept], bool(kept) and kept[0][0] == 0


def _apply_behavior(parts: list[tuple[int, int, bool]], behavior: str) -> list[tuple[int, int]]:
    if behavior == "Removed":
        return [(s, e) for s, e, is_match in parts if not is_match]
    if behavior == "Isolated":
        return [(s, e) for s, e, _ in parts]
    out: list[list[int]] = []
    previous_match = False
    if behavior == "MergedWithNext":
        for s, e, is_match in reversed(parts):
            if is_match and not previous_match and out:
                out[-1][0] = s
            else:
                out.append([s, e])
            previous_match = is_match
        return [(s, e) for s, e in reversed(out)]
    for s, e, is_match in parts:
        if behavior == "MergedWithPrevious":
            merge = is_match and not previous_match and bool(out)
        else:  # Contiguous
            merge = is_match == previous_match and bool(out)
        if merge:
            out[-1][1] = e
        else:
            out.append([s, e])
        previous_match = is_match
    return [(s, e) for s, e in out]


def _byte_level(add_prefix_space: bool, use_regex: bool, text: str) -> tuple[Pieces, bool]:
    """GPT-2's step: an optional leading space, GPT-2's split, then each UTF-8 byte as its
    printable character (so BPE works on bytes written as text)."""
    if add_prefix_space and not text.startswith(" "):
        text = " " + text
    parts = split_by(GPT2_SPLIT, "Isolated", False, text)[0] if use_regex else [text]
    return [byte_chars(p) for p in parts], True


def byte_chars(text: str) -> str:
    """Each UTF-8 byte of `text` as GPT-2's printable character ("é" -> "Ã©", " " -> "Ġ")."""
    return text.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_CHARS)


def _metaspace(spec: Spec) -> PreTokenize:
    replacement = one_char(spec, "replacement")
    spec.ignore("str_rep")
    legacy = spec.get("add_prefix_space", bool, None)  # files before prepend_scheme
    scheme = spec.get("prepend_scheme", str, "always" if legacy in (True, None) else "never")
    if scheme not in ("always", "first", "never"):
        raise spec.error(f"'prepend_scheme' must be always, first or never, not {scheme!r}")
    split = spec.get("split", bool, True)
    marker = regex.compile(regex.escape(replacement))

    def step(pieces: Pieces, at_start: bool) -> tuple[Pieces, bool]:
        out: Pieces = []
        for k, piece in enumerate(pieces):
            piece = piece.replace(" ", replacement)
            if not piece.startswith(replacement) and (
                    scheme == "always" or (scheme == "first" and at_start and k == 0)):
                piece = replacement + piece
            out.extend(split_by(marker, "MergedWithNext", False, piece)[0] if split else [piece])
        return [p for p in out if p], at_start
    return step
