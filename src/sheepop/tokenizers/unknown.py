"""The one warning for text a tokenizer cannot write: `sheepop generate` (the prompt), `eval`,
`train --resume` and `--init-from` on new data (the data) all say it the same way, with how
many characters (words, for the word kind) and the commonest of them.

What counts as unknown is `Tokenizer.unknown_pieces`: the characters that do not survive a
round trip (mapped to <|unk|>, or dropped by a byte-level vocabulary that lacks their bytes)."""

from __future__ import annotations

from collections import Counter

from sheepop.errors import UserError
from sheepop.tokenizers.base import Tokenizer

EXAMPLES = 5  # the commonest unknown pieces a warning shows


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
