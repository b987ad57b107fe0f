"""The regex pre-split of byte-level BPE, and the byte <-> printable-character map of GPT-2.

Before BPE sees any bytes, text is cut into "words" by a regular expression, and merges never
cross a word boundary: " the" can become one token, "e t" never. The patterns:

- `gpt2`: GPT-2's rule (contractions, an optional space + letters, an optional space + digits,
  an optional space + other symbols, whitespace runs), except that combining marks (\\p{M}) count
  as letters, so "e" + U+0301 stays one word instead of splitting off its accent.
- `gpt4`: the cl100k rule (case-insensitive contractions, a non-letter prefix + letters, numbers
  in groups of at most 3 digits, symbols with trailing newlines, newline runs), with the same
  combining-mark change.
- `gpt2-exact`: OpenAI's GPT-2 rule unchanged, used when importing GPT-2 files so ids match
  GPT-2 exactly.

The byte map (GPT-2's `bytes_to_unicode`) gives each of the 256 bytes a printable character
(printable ASCII and Latin-1 map to themselves, the rest to U+0100 onwards: space -> "Ġ",
newline -> "Ċ"). It is how byte-level tokens are written in vocab.json / tokenizer.json files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache

import regex

from sheepop.errors import UserError

PATTERNS: dict[str, str] = {
    "gpt2": (r"""'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}\p{M}]+| ?\p{N}+| ?[^\s\p{L}\p{M}\p{N}]+"""
             r"""|\s+(?!\S)|\s+"""),
    "gpt4": (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+|\p{N}{1,3}"""
             r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
    "gpt2-exact": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
}
DEFAULT_PATTERN = "gpt2"

# The named patterns as they act on ASCII text, for the standard library's `re`, which splits
# ~2.5x faster than `regex` (pre-splitting is most of BPE training's counting): on ASCII,
# \p{L} is [A-Za-z], \p{M} matches nothing and \p{N} is [0-9], and both engines' \s is the
# same six characters. tests/tokenizers/test_pretokenize.py checks that each splits every ASCII
# text as its pattern does.
ASCII_PATTERNS: dict[str, str] = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""",
    "gpt4": (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{1,3}"""
             r"""| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
}
ASCII_PATTERNS["gpt2-exact"] = ASCII_PATTERNS["gpt2"]  # they differ only on marks (\p{M})
MIXED_PIECE_CHARS = 1024
"""Text that is not all ASCII is split in safe pieces of about this size, so that its ASCII
pieces still take the fast path."""

# A cut just after a newline that sits between two non-space characters falls on a word
# boundary for all three named patterns, so text cut there can be encoded in parallel pieces.
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""The characters `regex` matches with \\s (Unicode's White_Space), as a class body for `re`,
whose own \\s differs (it also matches \\x1c-\\x1f); test_pretokenize.py checks every code point."""
_SAFE_CUT = re.compile(f"(?<=[^{WHITESPACE}]\n)(?=[^{WHITESPACE}])")  # `re`: 3x faster here
_LAST_SAFE_CUT = regex.compile(r"(?r)(?<=\S\n)(?=\S)")  # (?r): searched from the end


def resolve_pattern(pattern: str) -> str:
    """A named pattern's regex, or `pattern` itself after checking that it compiles."""
    pattern = PATTERNS.get(pattern, pattern)
    try:
        regex.compile(pattern)
    except regex.error as e:
        raise UserError(f"invalid pre-split pattern {pattern!r}: {e}") from None
    return pattern


def pattern_name(pattern: str) -> str:
    """The name of a built-in pattern, or "custom"."""
    return next((name for name, p in PATTERNS.items() if p == pattern), "custom")


@lru_cache(maxsize=16)
def compiled(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


@lru_cache(maxsize=16)
def ascii_twin(pattern: str) -> re.Pattern | None:
    """The `re` form of a named pattern for ASCII text (ASCII_PATTERNS); None for a custom one."""
    name = pattern_name(pattern)
    return None if name == "custom" else re.compile(ASCII_PATTERNS[name], re.ASCII)


def _dense_non_ascii(text: str) -> bool:
    """More than about one non-ASCII character per MIXED_PIECE_CHARS (each adds 1-3 bytes to
    the UTF-8 form): then few pieces would be all ASCII, and cutting would cost more than the
    twin saves (Russian or Chinese text, say)."""
    extra = len(text.encode("utf-8", "surrogatepass")) - len(text)
    return extra > 3 * len(text) // MIXED_PIECE_CHARS


def split_text(pattern: regex.Pattern, text: str) -> list[str]:
    """The words of `text`. A named pattern splits ASCII through its `re` twin (the same words,
    faster), and other text in safe pieces (the same words as the whole: see `_SAFE_CUT`),
    each ASCII one through the twin. Text a custom pattern does not match is kept as words of
    its own, so nothing is ever dropped."""
    twin = ascii_twin(pattern.pattern)
    if twin is not None:  # a named pattern matches every character
        if text.isascii():
            return twin.findall(text)
        if len(text) <= MIXED_PIECE_CHARS or _dense_non_ascii(text):
            return pattern.findall(text)
        words: list[str] = []
        for piece in iter_safe_chunks(text, MIXED_PIECE_CHARS):
            words += twin.findall(piece) if piece.isascii() else pattern.findall(piece)
        return words
    words = pattern.findall(text)
    if sum(map(len, words)) == len(text):
        return words
    words, start = [], 0
    for m in pattern.finditer(text):
        if m.start() > start:
            words.append(text[start:m.start()])
        if m.end() > m.start():
            words.append(m.group())
        start = m.end()
    if start < len(text):
        words.append(text[start:])
    return words


def cuts_safely(pattern: str, special_tokens: Sequence[str] = ()) -> bool:
    """Whether cutting text at safe points (see _SAFE_CUT) leaves its words and special tokens
    unchanged: true for the named patterns, unless a special token holds a newline (a cut
    could fall inside it). A custom pattern's words may cross any point, so it is never cut."""
    return (PATTERNS.get(pattern, pattern) in PATTERNS.values()
            and not any("\n" in s for s in special_tokens))


def iter_safe_chunks(text: str, target_chars: int) -> Iterator[str]:
    """`text` in pieces of about `target_chars` characters (longer where no safe point comes
    sooner), cut only at safe points, one at a time: they join back to `text`."""
    if len(text) <= target_chars:
        yield text
        return
    start = 0
    while len(text) - start > target_chars:
        m = _SAFE_CUT.search(text, start + target_chars)
        if m is None:
            break
        yield text[start:m.start()]
        start = m.start()
    yield text[start:]


def safe_chunks(text: str, target_chars: int) -> list[str]:
    """Cut `text` into pieces of about `target_chars` characters at word boundaries (see
    _SAFE_CUT), so that encoding the pieces separately gives the same ids as the whole."""
    return list(iter_safe_chunks(text, target_chars))


def rejoin_at_safe_cuts(blocks: Iterable[str]) -> Iterator[str]:
    """One text that arrives in blocks cut anywhere (a file read a megabyte at a time) ->
    pieces cut only at safe points, each up to the last safe point of what has arrived; they
    join back to the text, so a file never needs to be in memory whole."""
    held: list[str] = []  # text since the last cut, joined only once a cut is found
    tail = ""  # its last two characters: the cut's look-behind may reach into them
    for block in blocks:
        if not block:
            continue
        text = tail + block
        m = _LAST_SAFE_CUT.search(text, len(tail))
        if m is None:
            held.append(block)
        else:
            cut = m.start() - len(tail)
            yield "".join(held) + block[:cut]
            held = [block[cut:]]
        tail = text[-2:]
    if held:
        yield "".join(held)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_str(token: bytes) -> str:
    """Bytes of a token -> its printable byte-level name (b" the" -> "Ġthe")."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def str_to_token(name: str) -> bytes | None:
    """Inverse of `token_to_str`; None when `name` holds a character outside the byte map."""
    table = unicode_to_bytes()
    try:
        return bytes(table[c] for c in name)
    except KeyError:
        return None
