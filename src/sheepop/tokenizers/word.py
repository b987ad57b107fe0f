"""Word tokenizer: one id per word, punctuation mark or line break seen in the corpus.

Text is cut into words (letters, combining marks, digits and underscores, with inner
apostrophes: "don't"), single punctuation characters, and "\n". Other whitespace is dropped, so
decoding has to put the spaces back: one space between two tokens, except before closing
punctuation (". , ; : ! ? ) ] } %"), after an opening bracket, and around a line break. That
restores ordinary prose exactly and everything else up to spacing; re-encoding decoded text
always gives the same ids back.

Ids 0..3 are <|bos|> <|eos|> <|pad|> <|unk|>; then the words, most frequent first (ties in
code-point order). Words rarer than `min_freq`, or past the vocabulary size, become <|unk|>.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import regex

from sheepop.errors import UserError
from sheepop.tokenizers.base import DEFAULT_SPECIALS, UNK, Tokenizer
from sheepop.tokenizers.file_checks import bad_file, leading_and_added, read_specials

WORD_PATTERN = r"[\p{L}\p{M}\p{N}_]+(?:['’][\p{L}\p{M}\p{N}_]+)*|\n|[^\s\p{L}\p{M}\p{N}_]"
_WORD_RE = regex.compile(WORD_PATTERN)
NO_SPACE_BEFORE = frozenset(".,;:!?)]}%\n")
NO_SPACE_AFTER = frozenset("([{\n")


def split_words(text: str, lowercase: bool = False) -> list[str]:
    """The word tokenizer's pieces of `text` (whitespace other than newlines dropped)."""
    return _WORD_RE.findall(text.lower() if lowercase else text)


class WordTokenizer(Tokenizer):
    kind = "word"

    def __init__(self, words: Sequence[str], special_tokens: Sequence[str] = DEFAULT_SPECIALS,
                 lowercase: bool = False, added_specials: Sequence[str] = ()) -> None:
        """`special_tokens` take ids 0.., the words the next ones, `added_specials` (added to
        a trained tokenizer: Tokenizer.with_special_tokens) those after them."""
        offset = len(special_tokens)
        super().__init__({**{t: i for i, t in enumerate(special_tokens)},
                          **{t: offset + len(words) + k for k, t in enumerate(added_specials)}})
        self.words: list[str] = list(words)
        self.lowercase = lowercase
        self._stoi: dict[str, int] = {w: offset + i for i, w in enumerate(self.words)}
        self._itos: dict[int, str] = {i: w for w, i in self._stoi.items()}

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 0, min_freq: int = 1,
              max_vocab: int = 0, lowercase: bool = False) -> WordTokenizer:
        """Keep words seen at least `min_freq` times, the most frequent first, up to
        `vocab_size` ids in all (`max_vocab` is another name for it; 0 = no limit)."""
        limit = _word_limit(vocab_size, max_vocab, min_freq)
        n_special = len(DEFAULT_SPECIALS)
        probe = cls([], lowercase=lowercase)  # to cut special tokens out of the corpus
        counts: Counter[str] = Counter()
        for text in texts:
            for piece, special in probe.split_specials(text):
                if special is None:
                    counts.update(split_words(piece, lowercase))
        if not counts:
            raise UserError("cannot train a word tokenizer on an empty corpus (no words found)")
        ranked = sorted((w for w, n in counts.items() if n >= min_freq),
                        key=lambda w: (-counts[w], w))
        if not ranked:
            raise UserError(f"word tokenizer: no word occurs at least min_freq={min_freq} times")
        if limit:
            ranked = ranked[:limit - n_special]
        return cls(ranked, lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.special_tokens) + len(self.words)

    def _encode_ordinary(self, text: str) -> list[int]:
        stoi, unk = self._stoi, self.unk_id
        return [stoi.get(w, unk) for w in split_words(text, self.lowercase)]  # type: ignore

    def unknown_pieces(self, texts: str | Iterable[str]) -> Counter[str]:
        """The words of the texts (as the tokenizer splits them) that map to <|unk|>."""
        from sheepop.tokenizers.unknown import ordinary_pieces
        return Counter(w for piece in ordinary_pieces(self, texts)
                       for w in split_words(piece, self.lowercase) if w not in self._stoi)

    def _piece(self, i: int, prev: int | None, skip_special: bool) -> bytes:
        # <|unk|> stands for a word, so it is spaced like one; other specials are not spaced.
        if i == self.unk_id and not skip_special:
            return self._spaced(UNK, prev)
        return super()._piece(i, prev, skip_special)

    def _piece_bytes(self, i: int, prev: int | None) -> bytes:
        return self._spaced(self._itos[i], prev)

    def vocabulary_bytes(self) -> list[bytes | None]:
        raise UserError("a word tokenizer's tokens have no bytes of their own (the space before "
                        "a word depends on the word before it), so its output cannot be "
                        "constrained: use a char, bpe or pretrained tokenizer")

    def _spaced(self, word: str, prev: int | None) -> bytes:
        if prev is None or word in NO_SPACE_BEFORE:
            return word.encode("utf-8")
        if prev == self.unk_id:
            before = UNK
        else:
            before = self._itos.get(prev)
            if before is None:  # after <|bos|>, <|eos|>, <|pad|>: no space
                return word.encode("utf-8")
        if before in NO_SPACE_AFTER:
            return word.encode("utf-8")
        return b" " + word.encode("utf-8")

    def _token_str(self, i: int) -> str:
        return self._itos[i]

    def _str_to_id(self, token: str) -> int | None:
        return self._stoi.get(token)

    def _payload(self) -> dict[str, Any]:
        return {"lowercase": self.lowercase, "words": self.words}

    @classmethod
    def _from_payload(cls, data: dict[str, Any], where: str) -> WordTokenizer:
        specials = read_specials(data, where)
        words = data.get("words")
        if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
            raise bad_file(where, "'words' must be a list of non-empty strings")
        if len(set(words)) != len(words):
            raise bad_file(where, "'words' lists a word twice")
        lowercase = data.get("lowercase", False)
        if not isinstance(lowercase, bool):
            raise bad_file(where, "'lowercase' must be true or false")
        lead, added = leading_and_added(specials, len(words), where)
        return cls(words, special_tokens=lead, lowercase=lowercase, added_specials=added)


def _word_limit(vocab_size: int, max_vocab: int, min_freq: int) -> int:
    """The vocabulary size asked for (0: no limit), once the settings are checked: max_vocab
    and vocab_size are one setting, min_freq an integer >= 1, room left after the specials."""
    if max_vocab and vocab_size and max_vocab != vocab_size:
        raise UserError(f"word tokenizer: max_vocab {max_vocab} and vocab_size {vocab_size} "
                        "disagree (they are the same setting)")
    limit = max_vocab or vocab_size
    if not isinstance(min_freq, int) or min_freq < 1:
        raise UserError(f"word tokenizer: min_freq must be an integer >= 1, got {min_freq!r}")
    if limit and limit <= len(DEFAULT_SPECIALS):
        raise UserError(f"word vocab_size {limit} leaves no room for words after the "
                        f"{len(DEFAULT_SPECIALS)} special tokens")
    return limit
