"""Byte-level BPE: any UTF-8 text round-trips exactly and nothing is ever unknown.

Encoding `text`:
1. special tokens written in the text are cut out whole (they are never merged);
2. the rest is pre-split into words by the pattern (see pretokenize.py);
3. each word becomes its UTF-8 bytes, one token per byte;
4. repeatedly, among the adjacent pairs of the word, the pair with the lowest merge rank
   (learned earliest) is replaced, everywhere in the word left to right, by the token it makes;
   a word ends when no adjacent pair has a rank;
5. words seen before come from a cache instead of step 3-4.

Ids of a tokenizer trained here: 0..255 are the single bytes (id b is byte b), then one id per
merge in the order learned, then the special tokens (default <|bos|> <|eos|> <|pad|>). An
imported GPT-2 tokenizer keeps GPT-2's own ids. Vocabulary sizes count the special tokens.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from typing import Any

from sheepop.errors import UserError
from sheepop.tokenizers import bpe_train
from sheepop.tokenizers.base import BOS, EOS, PAD, Tokenizer
from sheepop.tokenizers.file_checks import bad_file, read_specials
from sheepop.tokenizers.parallel import batched, map_ordered, resolve_workers
from sheepop.tokenizers.pretokenize import (
    DEFAULT_PATTERN,
    compiled,
    pattern_name,
    resolve_pattern,
    safe_chunks,
    split_text,
    str_to_token,
    token_to_str,
)

BPE_SPECIALS = (BOS, EOS, PAD)
CACHE_LIMIT = 200_000
"""Distinct words remembered by the encoder; the cache is emptied when it is full."""


class BPETokenizer(Tokenizer):
    kind = "bpe"

    def __init__(self, tokens: Sequence[bytes | None], merges: Sequence[tuple[int, int]],
                 special_tokens: dict[str, int], pattern: str = DEFAULT_PATTERN) -> None:
        """`tokens[i]`: the bytes of token i (None at the ids of special tokens);
        `merges`: pairs of ids in rank order; each makes the token with their joined bytes."""
        super().__init__(special_tokens)
        self.pattern = resolve_pattern(pattern)
        self._re = compiled(self.pattern)
        self.tokens: list[bytes | None] = list(tokens)
        self.merges: list[tuple[int, int]] = [tuple(m) for m in merges]  # type: ignore[misc]
        self._ids: dict[bytes, int] = {t: i for i, t in enumerate(self.tokens) if t is not None}
        self._byte_ids = [self._ids[bytes([b])] for b in range(256)]
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}  # pair -> (rank, new id)
        self._made: list[int] = []  # rank -> id of the token the merge makes
        for rank, (a, b) in enumerate(self.merges):
            made = self._ids[self.tokens[a] + self.tokens[b]]  # type: ignore[operator]
            self._made.append(made)
            self._ranks.setdefault((a, b), (rank, made))
        self._rank_of = {pair: rank for pair, (rank, _) in self._ranks.items()}
        self._cache: dict[str, list[int]] = {}

    # ----- training ---------------------------------------------------------------------------

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, pattern: str = DEFAULT_PATTERN,
              special_tokens: Sequence[str] = BPE_SPECIALS, backend: str = "sheepop",
              trainer: str = "fast", workers: int = 1, progress: bool = False) -> BPETokenizer:
        """Learn merges until `vocab_size` ids (256 bytes + merges + specials) or no pair left
        (see bpe_train.py: `workers` processes count the words, 1: this process only, 0: one
        per CPU; backend "hf" counts and merges through Hugging Face `tokenizers` instead)."""
        special_tokens = list(special_tokens)
        pattern = resolve_pattern(pattern)
        merged = bpe_train.train_merges(texts, vocab_size, pattern, special_tokens, backend,
                                        trainer, workers, progress)
        return cls.from_merged_bytes(merged, special_tokens, pattern)

    @classmethod
    def from_merged_bytes(cls, merged: Sequence[tuple[bytes, bytes]],
                          special_tokens: Sequence[str], pattern: str) -> BPETokenizer:
        """Build from merges given as byte strings, in rank order, in sheepop's id layout."""
        tokens: list[bytes | None] = [bytes([b]) for b in range(256)]
        ids = {t: i for i, t in enumerate(tokens)}
        merges = []
        for left, right in merged:
            if left not in ids or right not in ids:
                raise UserError(f"merge {left!r} + {right!r} uses a token no earlier merge made")
            if left + right not in ids:
                ids[left + right] = len(tokens)
                tokens.append(left + right)
            merges.append((ids[left], ids[right]))
        return cls._with_specials(tokens, merges, special_tokens, pattern)

    @classmethod
    def _with_specials(cls, tokens: list[bytes | None], merges: list[tuple[int, int]],
                       special_tokens: Sequence[str], pattern: str) -> BPETokenizer:
        specials = {t: len(tokens) + k for k, t in enumerate(special_tokens)}
        return cls(tokens + [None] * len(specials), merges, specials, pattern)

    # ----- encoding ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def _encode_ordinary(self, text: str) -> list[int]:
        words = split_text(self._re, text)
        cache = self._cache
        missing = set(words).difference(cache)
        if missing:
            if len(cache) + len(missing) > CACHE_LIMIT:
                cache.clear()  # keeps memory bounded; this text's words go in below
            for word in missing:
                cache[word] = self.encode_word(word)
        return list(chain.from_iterable(map(cache.__getitem__, words)))

    def encode_word(self, word: str) -> list[int]:
        """BPE on one pre-split word: apply the lowest-ranked merge until none applies."""
        byte_ids = self._byte_ids
        ids = [byte_ids[b] for b in word.encode("utf-8", "surrogatepass")]
        rank_of, never = self._rank_of.get, repeat(len(self.merges))
        while len(ids) > 1:
            # min over the ranks of the adjacent pairs; a pair with no merge ranks last.
            rank = min(map(rank_of, zip(ids, ids[1:]), never))
            if rank == len(self.merges):
                break
            a, b = self.merges[rank]
            ids = bpe_train.merge_word(ids, a, b, self._made[rank])
        return ids

    def encode_batch(self, texts: Iterable[str], add_bos: bool = False, add_eos: bool = False,
                     workers: int = 1) -> list[list[int]]:
        """Encode many texts; with workers != 1 (0 = one per CPU), in several processes."""
        texts = list(texts)
        workers, min_chars = resolve_workers(workers), bpe_train.PARALLEL_MIN_CHARS
        if workers == 1 or sum(map(len, texts)) < min_chars:
            return [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        batches = list(batched(texts, max(min_chars // 4, 1)))
        jobs = [(batch, add_bos, add_eos) for batch in batches]
        results = map_ordered(_encode_batch_in_worker, jobs, workers,
                              initializer=_init_worker, initargs=(self.to_json(),))
        return [ids.tolist() for part in results for ids in part]

    def encode_parallel(self, text: str, workers: int = 0) -> list[int]:
        """`encode(text)` for one large text, cut at word boundaries and spread over processes.
        Gives exactly the ids of `encode(text)`."""
        workers, min_chars = resolve_workers(workers), bpe_train.PARALLEL_MIN_CHARS
        if workers == 1 or len(text) < min_chars or any(
                "\n" in t for t in self.special_tokens):
            return self.encode(text)
        chunks = safe_chunks(text, max(len(text) // (4 * workers), min_chars // 4))
        if len(chunks) == 1:
            return self.encode(text)
        results = map_ordered(_encode_batch_in_worker, [([c], False, False) for c in chunks],
                              workers, initializer=_init_worker, initargs=(self.to_json(),))
        out: list[int] = []
        for part in results:
            out.extend(part[0].tolist())
        return out

    # ----- decoding and the vocabulary --------------------------------------------------------

    def _knows(self, char: str) -> bool:
        return True  # byte-level: every character is its UTF-8 bytes, each a token

    def _piece_bytes(self, i: int, prev: int | None) -> bytes:
        return self.tokens[i]  # type: ignore[return-value]

    def _token_str(self, i: int) -> str:
        return token_to_str(self.tokens[i])  # type: ignore[arg-type]

    def _str_to_id(self, token: str) -> int | None:
        data = str_to_token(token)
        return None if data is None else self._ids.get(data)

    # ----- the file ---------------------------------------------------------------------------

    def _payload(self) -> dict[str, Any]:
        return {
            "pattern_name": pattern_name(self.pattern),
            "pattern": self.pattern,
            "tokens": [self._special_by_id[i] if t is None else token_to_str(t)
                       for i, t in enumerate(self.tokens)],
            "merges": [[token_to_str(self.tokens[a]), token_to_str(self.tokens[b])]  # type: ignore
                       for a, b in self.merges],
        }

    def _payload_with_specials(self, payload: dict[str, Any], added: dict[str, int]) -> None:
        payload["tokens"].extend(added)  # a special token's name stands at its id

    @classmethod
    def _from_payload(cls, data: dict[str, Any], where: str) -> BPETokenizer:
        specials = read_specials(data, where)
        names, pairs, pattern = data.get("tokens"), data.get("merges"), data.get("pattern")
        if not isinstance(pattern, str):
            raise bad_file(where, "bpe 'pattern' must be a string")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise bad_file(where, "bpe 'tokens' must be a list of strings")
        if not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p)
                for p in pairs):
            raise bad_file(where, "bpe 'merges' must be a list of [left, right] string pairs")
        tokens, ids = _read_tokens(names, specials, where)
        return cls(tokens, _read_merges(pairs, tokens, ids, where), specials, pattern)


def _read_tokens(names: list[str], specials: dict[str, int], where: str
                 ) -> tuple[list[bytes | None], dict[bytes, int]]:
    """The file's tokens as bytes (None at a special token's id) and the id of each: every
    name a byte-level token, none twice, the 256 single bytes all there."""
    by_id = {i: t for t, i in specials.items()}
    if any(not 0 <= i < len(names) or names[i] != t for t, i in specials.items()):
        raise bad_file(where, "a special token's id does not hold that token in 'tokens'")
    tokens: list[bytes | None] = []
    for i, name in enumerate(names):
        tokens.append(None if i in by_id else str_to_token(name))
        if i not in by_id and tokens[-1] is None:
            raise bad_file(where, f"token {i} ({name!r}) is not a byte-level token")
    ids = {t: i for i, t in enumerate(tokens) if t is not None}
    if len(ids) + len(specials) != len(tokens):
        raise bad_file(where, "two tokens have the same bytes")
    if any(bytes([b]) not in ids for b in range(256)):
        raise bad_file(where, "the 256 single-byte tokens are not all present")
    return tokens, ids


def _read_merges(pairs: list[list[str]], tokens: list[bytes | None], ids: dict[bytes, int],
                 where: str) -> list[tuple[int, int]]:
    """The merges as id pairs, each joining two tokens into a token of the vocabulary."""
    merges = []
    for left, right in pairs:
        a, b = ids.get(str_to_token(left) or b""), ids.get(str_to_token(right) or b"")
        if a is None or b is None or tokens[a] + tokens[b] not in ids:  # type: ignore
            raise bad_file(where, f"merge {left!r} {right!r} does not join two tokens "
                                  "into a token of the vocabulary")
        merges.append((a, b))
    return merges


# ----- encoding in worker processes ---------------------------------------------------------

_WORKER_TOKENIZER: BPETokenizer | None = None


def _init_worker(json_text: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = BPETokenizer._from_payload(json.loads(json_text), "worker")


def _encode_batch_in_worker(job: tuple[list[str], bool, bool]) -> list[array]:
    """Ids as compact arrays: they travel between processes as raw bytes, not int objects."""
    texts, add_bos, add_eos = job
    tok = _WORKER_TOKENIZER
    assert tok is not None
    return [array("q", tok.encode(t, add_bos=add_bos, add_eos=add_eos)) for t in texts]
