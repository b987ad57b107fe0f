"""The one warning for text a tokenizer cannot write: `sheepop generate` (the prompt), `eval`,
`train --resume` and `--init-from` on new data (the data) all say it the same way, with how
many characters (words, for the word kind) and the commonest of them.

What counts as unknown is `Tokenizer.unknown_pieces`: the characters that do not survive a
round trip (mapped to <|unk|>, or dropped by a byte-level vocabulary that lacks their bytes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from sheepop.errors import UserError


class Tokenizer(Protocol):
    """What these rules ask of a tokenizer (sheepop.tokenizers.base.Tokenizer, which calls
    them: so they name its parts here instead of importing it)."""
    kind: str

    @property
    def unk_id(self) -> int | None: ...
    def split_specials(self, text: str) -> Iterable[tuple[str, int | None]]: ...
    def encode(self, text: str) -> list[int]: ...
    def _encode_ordinary(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def _knows(self, char: str) -> bool: ...

EXAMPLES = 5  # the commonest unknown pieces a warning shows


def ordinary_pieces(tokenizer: Tokenizer, texts: str | Iterable[str]) -> Iterator[str]:
    """The parts of a text, or of several, outside special tokens."""
    for text in [texts] if isinstance(texts, str) else texts:
        yield from (p for p, special in tokenizer.split_specials(text) if special is None)


def unknown_characters(tokenizer: Tokenizer, texts: str | Iterable[str]) -> Counter[str]:
    """The characters of the texts (outside special tokens) that `tokenizer` does not know
    (its `_knows`, asked once per distinct character), each with its count. Whether the kind
    maps them to <|unk|> or drops them, they are not the text."""
    counts: Counter[str] = Counter()
    for piece in ordinary_pieces(tokenizer, texts):
        counts.update(piece)
    return Counter({c: n for c, n in counts.items() if not tokenizer._knows(c)})


def round_trips(tokenizer: Tokenizer, char: str) -> bool:
    """Whether `char` survives a round trip: it encodes to tokens, none of them <|unk|>, that
    decode to text (not to nothing, nor to U+FFFD for part of its bytes). A byte-level
    vocabulary without some bytes (SmolLM2's lacks a few control bytes) drops them: they are
    unknown too, though no <|unk|> says so."""
    try:
        ids = tokenizer._encode_ordinary(char)
    except UserError:  # a kind without <|unk|> refuses what it does not know
        return False
    if not ids or (tokenizer.unk_id is not None and tokenizer.unk_id in ids):
        return False
    back = tokenizer.decode(ids)
    return bool(back) and ("\ufffd" not in back or char == "\ufffd")


def unknown_warning(tokenizer: Tokenizer, pieces: Counter[str], what: str) -> str | None:
    """'warning: 4,401 characters of the data are not in the vocabulary, encoded as the unknown
    token (e.g. '的' x210, '是' x95, ...)'; None when `pieces` is empty."""
    count = sum(pieces.values())
    if count <= 0:
        return None
    unit = "word" if tokenizer.kind == "word" else "character"
    shown = ", ".join(f"{piece!r} x{n:,}" for piece, n in pieces.most_common(EXAMPLES))
    more = ", ..." if len(pieces) > EXAMPLES else ""
    return (f"warning: {count:,} {unit}{'s' if count != 1 else ''} of {what} "
            f"{'is' if count == 1 else 'are'} not in the vocabulary, "
            f"{_fate(tokenizer, next(iter(pieces)))} (e.g. {shown}{more})")


def _fate(tokenizer: Tokenizer, piece: str) -> str:
    """What encoding does with an unknown piece: <|unk|> stands for it, or it is dropped."""
    try:
        ids = tokenizer.encode(piece)
    except UserError:  # a kind without <|unk|> refuses it
        return "refused by the encoding"
    unk = tokenizer.unk_id
    if unk is not None and unk in ids:
        return "encoded as the unknown token"
    return "dropped by the encoding"
