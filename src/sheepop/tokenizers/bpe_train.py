"""Learning byte-level BPE merges: a fast trainer and a naive one that must agree with it.

Both start from the same state: every distinct pre-split word of the corpus, counted once, as a
list of byte ids 0..255, with its number of occurrences. Then, until the vocabulary is full or
no word has two tokens left:

1. count every adjacent pair of tokens, weighted by the word counts;
2. pick the most frequent pair; ties go to the lowest pair in byte order, i.e. the smallest
   (bytes of the left token, bytes of the right token) -- so training is deterministic;
3. give the pair a new id whose bytes are the two tokens' bytes joined (or the existing id if a
   token with those bytes already exists: an earlier merge may have built the same bytes from
   another split), record the merge, and replace the pair by the new id in every word, left to
   right.

`train_naive` does step 1 from scratch for every merge (clear, and slow: O(corpus) per merge).
`train_fast` counts pairs once, then after each merge updates the counts of only the words that
contained the merged pair (subtract their old pairs, add their new ones), and finds the best
pair with a heap whose entries may be stale: an entry records a count that is never below the
pair's true count, so when the top entry's count is current it is the true best; otherwise it
is pushed back with the true count. Counts that grow get a fresh entry at once.

`train_merges` is the whole of training from a corpus: it cuts out the special tokens, pre-splits
and counts the words (`count_words` in bpe_count.py, streamed, in several processes for a large
corpus), runs a trainer, and returns the merges as byte pairs, from which `BPETokenizer.train`
builds the tokenizer.
Backend "hf" hands the counting and merging to Hugging Face `tokenizers` (bpe_train_hf.py).
"""

from __future__ import annotations

import gc
import heapq
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

from sheepop.errors import UserError
from sheepop.tokenizers.bpe_count import count_words

Merge = tuple[int, int]
PARALLEL_MIN_CHARS = 1 << 20
"""Below this much text, starting processes costs more than it saves."""


def train_merges(texts: Iterable[str], vocab_size: int, pattern: str,
                 special_tokens: Sequence[str], backend: str = "sheepop", trainer: str = "fast",
                 workers: int = 1, progress: bool = False) -> list[tuple[bytes, bytes]]:
    """The merges (byte pairs, in rank order) that fill `vocab_size` ids: 256 bytes + merges +
    `special_tokens`; fewer when no pair is left. `pattern` is the pre-split regex."""
    if len(set(special_tokens)) != len(special_tokens) or not all(special_tokens):
        raise UserError("bpe special tokens must be distinct, non-empty strings")
    base = 256 + len(special_tokens)
    if vocab_size < base:
        raise UserError(f"bpe vocab_size {vocab_size} is smaller than the base alphabet "
                        f"(256 bytes + {len(special_tokens)} special tokens = {base})")
    n_tokens = vocab_size - len(special_tokens)
    if backend == "hf":
        from sheepop.tokenizers.bpe_train_hf import train_merges_hf
        return train_merges_hf(texts, n_tokens, pattern, special_tokens, progress)
    if backend != "sheepop":
        raise UserError(f"unknown bpe training backend {backend!r} (sheepop or hf)")
    if trainer not in ("fast", "naive"):
        raise UserError(f"unknown bpe trainer {trainer!r} (fast or naive)")
    counts = count_words(texts, pattern, special_tokens, workers)
    if not counts:
        raise UserError("cannot train a bpe tokenizer on an empty corpus")
    if trainer == "naive":
        merges = train_naive(counts.items(), n_tokens)
    else:  # the words become lists of byte ids: their strings are not needed while merging
        words, weights = initial_words(counts.items())
        del counts
        merges = _train_with_progress(words, weights, n_tokens, progress)
    vocab = _Vocab()
    for a, b in merges:  # replay, to name each merge by its tokens' bytes
        vocab.join(a, b)
    return [(vocab.tokens[a], vocab.tokens[b]) for a, b in merges]


def _train_with_progress(words: list[list[int]], weights: list[int], n_tokens: int,
                         progress: bool) -> list[Merge]:
    if not progress:
        return _train_fast_words(words, weights, n_tokens)
    from tqdm import tqdm
    with tqdm(total=max(n_tokens - 256, 0), desc="bpe merges", unit="merge") as bar:
        return _train_fast_words(words, weights, n_tokens, on_merge=lambda _: bar.update())


def initial_words(word_counts: Iterable[tuple[str, int]]) -> tuple[list[list[int]], list[int]]:
    """Words as lists of byte ids, and their counts; single-byte words can never merge."""
    words, counts = [], []
    for word, n in word_counts:
        ids = list(word.encode("utf-8", "surrogatepass"))
        if len(ids) > 1:
            words.append(ids)
            counts.append(n)
    return words, counts


def merge_word(word: list[int], a: int, b: int, new: int) -> list[int]:
    """`word` with every (a, b), scanned left to right, replaced by `new`."""
    out, i, n = [], 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


class _Vocab:
    """Token bytes by id, starting from the 256 single bytes; reuses ids for repeated bytes."""

    def __init__(self) -> None:
        self.tokens: list[bytes] = [bytes([b]) for b in range(256)]
        self.ids: dict[bytes, int] = {t: i for i, t in enumerate(self.tokens)}

    def join(self, a: int, b: int) -> int:
        joined = self.tokens[a] + self.tokens[b]
        i = self.ids.get(joined)
        if i is None:
            i = self.ids[joined] = len(self.tokens)
            self.tokens.append(joined)
        return i


def _merge_counting(word: list[int], a: int, b: int, new: int, n: int,
                    delta: dict[Merge, int], where: dict[Merge, list[int]],
                    wi: int) -> list[int] | None:
    """`merge_word`, also adding to `delta` the change in pair counts (times the word's count
    `n`) and noting word `wi` under its new pairs in `where` (once: see `_train_fast_words`).
    Only pairs next to a merge change: the old pairs (x, a), (a, b), (b, y) go, the new
    (x, new), (new, y) come. None when the word holds no (a, b)."""
    out: list[int] = []
    i, size = 0, len(word)
    last_old = -1  # index of the last old pair already subtracted (adjacent merges share one)
    after_merge = False
    while i < size:
        if i + 1 < size and word[i] == a and word[i + 1] == b:
            for k in (i - 1, i, i + 1):
                if last_old < k < size - 1:
                    delta[word[k], word[k + 1]] -= n
                    last_old = k
            if out:
                delta[out[-1], new] += n
                noted = where[out[-1], new]
                if not noted or noted[-1] != wi:
                    noted.append(wi)
            out.append(new)
            after_merge = True
            i += 2
        else:
            if after_merge:
                delta[new, word[i]] += n
                noted = where[new, word[i]]
                if not noted or noted[-1] != wi:
                    noted.append(wi)
                after_merge = False
            out.append(word[i])
            i += 1
    return out if len(out) < size else None


def train_naive(word_counts: Iterable[tuple[str, int]], n_tokens: int) -> list[Merge]:
    """Merges (in rank order) until there are `n_tokens` tokens (256 bytes included) or no pair
    is left; recounts every pair of every word for each merge."""
    words, counts = initial_words(word_counts)
    vocab = _Vocab()
    merges: list[Merge] = []
    done: set[Merge] = set()
    while len(vocab.tokens) < n_tokens:
        pairs: Counter[Merge] = Counter()
        for word, n in zip(words, counts):
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        for pair in done:  # a pair re-created by a reused id is not merged twice
            pairs.pop(pair, None)
        if not pairs:
            break
        t = vocab.tokens
        a, b = min(pairs, key=lambda p: (-pairs[p], t[p[0]], t[p[1]]))
        new = vocab.join(a, b)
        merges.append((a, b))
        done.add((a, b))
        words = [merge_word(w, a, b, new) for w in words]
    return merges


def train_fast(word_counts: Iterable[tuple[str, int]], n_tokens: int,
               on_merge: Callable[[int], None] | None = None) -> list[Merge]:
    """The same merges as `train_naive`, with incremental pair counts and a lazy heap."""
    return _train_fast_words(*initial_words(word_counts), n_tokens, on_merge)


def _train_fast_words(words: list[list[int]], counts: list[int], n_tokens: int,
                      on_merge: Callable[[int], None] | None = None) -> list[Merge]:
    """`train_fast` on `initial_words`' output; changes `words` in place.

    Python's cycle collector is paused meanwhile: the loop makes no cycles, but it allocates
    millions of lists and tuples, and each collection of the oldest generation would walk every
    word and word list again (10-20% of the time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _merge_loop(words, counts, n_tokens, on_merge)
    finally:
        if enabled:
            gc.enable()


def _merge_loop(words: list[list[int]], counts: list[int], n_tokens: int,
                on_merge: Callable[[int], None] | None) -> list[Merge]:
    vocab = _Vocab()
    t = vocab.tokens
    pair_count, where = _count_pairs(words, counts)
    heap = [(-c, t[a], t[b], a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)

    merges: list[Merge] = []
    done: set[Merge] = set()
    while len(t) < n_tokens and heap:
        neg, _, _, a, b = heapq.heappop(heap)
        current = pair_count.get((a, b), 0)
        if -neg != current or (a, b) in done:  # a stale entry
            if 0 < current < -neg and (a, b) not in done:
                heapq.heappush(heap, (-current, t[a], t[b], a, b))
            continue
        new = vocab.join(a, b)
        merges.append((a, b))
        done.add((a, b))
        delta: dict[Merge, int] = defaultdict(int)
        for wi in where.pop((a, b)):  # order does not matter: the updates commute
            word = words[wi]
            # Most visits: `a` once, so one (a, b) at most. The bookkeeping of `_merge_counting`
            # for that case, inlined: no call and no loop over the tokens (10-14% of merging).
            if word.count(a) == 1:
                i = word.index(a)
                if i + 1 == len(word) or word[i + 1] != b:
                    continue
                n = counts[wi]
                delta[a, b] -= n
                if i:
                    x = word[i - 1]
                    delta[x, a] -= n
                    delta[x, new] += n
                    noted = where[x, new]
                    if not noted or noted[-1] != wi:
                        noted.append(wi)
                if i + 2 < len(word):
                    y = word[i + 2]
                    delta[b, y] -= n
                    delta[new, y] += n
                    noted = where[new, y]
                    if not noted or noted[-1] != wi:
                        noted.append(wi)
                word[i:i + 2] = (new,)
                continue
            if a not in word:  # stale (a quarter of the visits): ruled out in C
                continue
            merged = _merge_counting(word, a, b, new, counts[wi], delta, where, wi)
            if merged is not None:
                words[wi] = merged
        _apply_delta(delta, pair_count, where, heap, t)
        if on_merge is not None:
            on_merge(len(merges))
    return merges


def _count_pairs(words: list[list[int]], counts: list[int]
                 ) -> tuple[dict[Merge, int], dict[Merge, list[int]]]:
    """Each adjacent pair's count over the words (weighted by the words' counts), and the
    words that may contain it, as lists (a set costs ~4x the memory). A word's notes for a
    pair are made in a row (a repeat of the last entry is skipped), so a word is listed twice
    only when a merge reuses an existing id; its second visit finds no pair left to merge and
    changes nothing."""
    pair_count: dict[Merge, int] = defaultdict(int)
    where: dict[Merge, list[int]] = defaultdict(list)
    for wi, (word, n) in enumerate(zip(words, counts)):
        for pair in zip(word, word[1:]):
            pair_count[pair] += n
            noted = where[pair]
            if not noted or noted[-1] != wi:
                noted.append(wi)
    return pair_count, where


def _apply_delta(delta: dict[Merge, int], pair_count: dict[Merge, int],
                 where: dict[Merge, list[int]], heap: list, t: list[bytes]) -> None:
    """One merge's changes to the pair counts: a grown count gets a fresh heap entry (shrunk
    ones are fixed lazily when popped), a pair gone from every word loses its word list."""
    for pair, d in delta.items():
        if d == 0:
            continue
        c = pair_count[pair] + d
        if c > 0:
            pair_count[pair] = c
            if d > 0:
                heapq.heappush(heap, (-c, t[pair[0]], t[pair[1]], pair[0], pair[1]))
        else:
            del pair_count[pair]
            where.pop(pair, None)
