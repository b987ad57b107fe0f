"""How many bytes of text each scored target stands for, and the units a loss is read in: bits
per byte, and perplexity.

Bits per byte is the loss measured against the text rather than against the tokens:

    bpb = (sum of nats over the scored targets) / (ln 2 * UTF-8 bytes of those targets)
        = L * N / (ln 2 * n_bytes)          (L: mean loss in nats/token, N: scored targets)

A tokenizer with longer tokens has fewer, harder targets, so its loss per token is higher for
the same model quality; per byte of the same text the figure no longer depends on the tokenizer.

The bytes of a target are the bytes `Tokenizer.decode` writes for it after the token before it,
except that a special token's own name (`<|eos|>`, `<|unk|>`, ...) counts 0: it is not text. So:

- char, digits: the UTF-8 length of the token's character;
- bpe (byte-level): the token's own bytes, even when they are part of a multi-byte character,
  so the targets of a text add up to exactly `len(text.encode("utf-8"))`;
- word: the word's UTF-8 bytes, plus 1 for the space decode puts before it (not before closing
  punctuation or a line break, nor after an opening bracket, a line break or a special token).
  The word tokenizer drops other whitespace, so this counts the decoded text, which is the
  original for ordinary prose (single spaces, no tabs); an <|unk|> counts only its space.

Characters the vocabulary lacks write no bytes of their own (an <|unk|> counts 0, a byte a
byte-level vocabulary drops is no token at all); over raw text, whose bytes are known,
`scored_text_bytes` adds them back, so that bits per byte is over the text's real UTF-8 bytes.

The nats of special targets (the EOS between documents) stay in the sum: where a document ends
is part of what the model has to predict. With no byte at all, bits per byte is undefined (None).
"""

from __future__ import annotations

import math

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.tokenizers.base import Tokenizer


def token_bytes(tokenizer: Tokenizer) -> np.ndarray:
    """(vocab_size,) int64: the UTF-8 bytes of each token on its own; 0 for special tokens."""
    specials = set(tokenizer.special_tokens.values())
    return np.array([0 if i in specials else len(tokenizer._piece_bytes(i, None))
                     for i in range(tokenizer.vocab_size)], dtype=np.int64)


def _word_spaces(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(takes, gives), (vocab_size,) bool each: decode puts a space before token y that follows
    token x exactly when takes[y] and gives[x] (the rule of WordTokenizer._spaced)."""
    from sheepop.tokenizers.word import NO_SPACE_AFTER, NO_SPACE_BEFORE

    v, unk = tokenizer.vocab_size, tokenizer.unk_id
    specials = set(tokenizer.special_tokens.values())
    takes, gives = np.zeros(v, dtype=bool), np.zeros(v, dtype=bool)
    for i in range(v):
        if i == unk:  # <|unk|> stands for a word, so it is spaced like one
            takes[i] = gives[i] = True
        elif i not in specials:
            word = tokenizer.id_to_token(i)
            takes[i], gives[i] = word not in NO_SPACE_BEFORE, word not in NO_SPACE_AFTER
    return takes, gives


class TargetBytes:
    """Counts the UTF-8 bytes of text that the scored targets of (x, y) windows stand for."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.per_token = token_bytes(tokenizer)
        # Only the word kind's bytes depend on the token before (its spaces); x holds it.
        self.spaces = _word_spaces(tokenizer) if tokenizer.kind == "word" else None

    def count(self, x: np.ndarray, y: np.ndarray) -> int:
        """Bytes of the targets y != IGNORE_INDEX; x[..., t] is the token before y[..., t]."""
        y = np.asarray(y)
        scored = y != IGNORE_INDEX
        targets = y[scored]
        n = int(np.take(self.per_token, targets).sum())
        if self.spaces is not None:
            takes, gives = self.spaces
            n += int((takes[targets] & gives[np.asarray(x)[scored]]).sum())
        return n


def bits_per_byte(nats: float, n_bytes: int) -> float | None:
    """nats / (ln 2 * n_bytes): the total loss in bits, per byte of text; None for no bytes."""
    return nats / (math.log(2) * n_bytes) if n_bytes > 0 else None


def perplexity(loss: float) -> float:
    """PPL = e^L, L the mean loss in nats/token (docs/math/08-loss.md, 8.2): inf where e^L is
    past float64's range (L > 709.78), where math.exp raises instead."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def scored_text_bytes(target_bytes: TargetBytes, x: np.ndarray, y: np.ndarray,
                      tokens: np.ndarray, text_bytes: int | None) -> int:
    """The bytes of text that the scored targets of (x, y), windows of the stream `tokens`,
    stand for: their own (`TargetBytes.count`), plus the bytes the tokens do not write at
    all (characters the vocabulary lacks: an <|unk|> counts 0 bytes, a dropped byte is no
    token), spread over the targets in proportion to those scored, so that the whole text
    scored counts exactly its `text_bytes` (the UTF-8 bytes of the documents read). Without
    `text_bytes` (prepared data: the text is not at hand) only their own bytes count."""
    n = target_bytes.count(x, y)
    stream = np.asarray(tokens, dtype=np.int64)
    if text_bytes is None or len(stream) < 2:
        return n
    written = (target_bytes.count(stream[None, :-1], stream[None, 1:])
               + int(target_bytes.per_token[stream[0]]))
    lost = text_bytes - written
    if lost <= 0:  # (the word kind's decoded spaces can outnumber the text's own)
        return n
    scored = int(np.count_nonzero(np.asarray(y) != IGNORE_INDEX))
    return n + round(lost * scored / (len(stream) - 1))
