"""The BPE model of a Hugging Face tokenizer.json: one pre-tokenized word -> ids.

Encoding a word, as `tokenizers`' BPE does:
1. `ignore_merges`: a word that is itself in the vocabulary is that one token (Llama 3);
2. each character becomes a symbol: its vocabulary entry (with `continuing_subword_prefix`
   before every character but the first, `end_of_word_suffix` after the last). A character
   that has none becomes, with `byte_fallback`, its UTF-8 bytes as `<0xNN>` tokens (when all of
   them exist), else `unk_token` (consecutive ones fused into one under `fuse_unk`), else
   nothing: with no unk token the character is dropped. That last rule is what happens to a
   byte a byte-level vocabulary lacks (SmolLM2 has no token for byte 0x04, say): it vanishes
   from the ids, exactly as in `tokenizers`.
3. repeatedly, the adjacent pair with the lowest merge rank, leftmost first, becomes the token
   the merge makes (`left + right`, the right one's continuing prefix removed); a word ends
   when no adjacent pair has a merge. (One pair at a time, as `tokenizers`' priority queue does;
   when a pair is listed twice, the later rank counts, as in `tokenizers`.)

Merges come as "left right" strings (exactly one space) or as [left, right] pairs, whose tokens
may themselves hold spaces (SentencePiece-style vocabularies). `dropout` must be null or 0:
random merges would make ids differ run to run.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

from sheepop.files import shown
from sheepop.tokenizers.pretrained.spec import Spec

NO_MERGE = 1 << 62
"""The rank of a pair that has no merge: above every real rank."""


class BPEModel:
    def __init__(self, data: Any, where: str) -> None:
        spec = Spec(data, where)
        if spec.type != "BPE":
            raise spec.error("sheepop reads BPE models only (WordPiece, WordLevel and Unigram "
                             "are not supported)")
        dropout = spec.get("dropout", (int, float), None)
        if dropout not in (None, 0):
            raise spec.refuse("dropout", dropout, "random merges make ids differ run to run")
        self.unk_token: str | None = spec.get("unk_token", str, None)
        self.prefix: str = spec.get("continuing_subword_prefix", str, "")
        self.suffix: str = spec.get("end_of_word_suffix", str, "")
        self.fuse_unk: bool = spec.get("fuse_unk", bool, False)
        self.byte_fallback: bool = spec.get("byte_fallback", bool, False)
        self.ignore_merges: bool = spec.get("ignore_merges", bool, False)
        self.vocab: dict[str, int] = _vocab(spec)
        self.merges: list[tuple[str, str]] = _merges(spec)
        spec.done()
        self.where = spec.where
        self.unk_id = None if self.unk_token is None else self.vocab.get(self.unk_token)
        if self.unk_token is not None and self.unk_id is None:
            raise spec.error(f"the unk_token {self.unk_token!r} is not in the vocabulary")
        self._ranks: dict[tuple[int, int], int] = {}
        self._made: list[int] = []
        for rank, (left, right) in enumerate(self.merges):
            a, b = self.vocab.get(left), self.vocab.get(right)
            made = self.vocab.get(left + right[len(self.prefix):])
            if a is None or b is None or made is None:
                raise spec.error(f"merge {rank} ({shown(left)} {shown(right)}) does not join "
                                 "two tokens of the vocabulary into a token of the vocabulary")
            self._ranks[a, b] = rank  # a pair listed twice: the later rank wins
            self._made.append(made)
        self._byte_ids = ([self.vocab.get(f"<0x{b:02X}>") for b in range(256)]
                          if self.byte_fallback else [])
        self._plain = not (self.prefix or self.suffix)

    def to_dict(self) -> dict[str, Any]:
        """The model as tokenizer.json writes it (merges as pairs, which any version reads)."""
        return {"type": "BPE", "dropout": None, "unk_token": self.unk_token,
                "continuing_subword_prefix": self.prefix or None,
                "end_of_word_suffix": self.suffix or None, "fuse_unk": self.fuse_unk,
                "byte_fallback": self.byte_fallback, "ignore_merges": self.ignore_merges,
                "vocab": dict(self.vocab), "merges": [list(m) for m in self.merges]}

    def encode_word(self, word: str) -> list[int]:
        """The ids of one pre-tokenized word (module docstring)."""
        if self.ignore_merges:
            whole = self.vocab.get(word)
            if whole is not None:
                return [whole]
        ids = self._symbols(word)
        ranks_of, made = self._ranks.get, self._made
        while len(ids) > 1:
            ranks = list(map(ranks_of, zip(ids, ids[1:]), repeat(NO_MERGE)))
            rank = min(ranks)
            if rank == NO_MERGE:
                break
            k = ranks.index(rank)  # the leftmost pair of the lowest rank
            ids[k:k + 2] = [made[rank]]
        return ids

    def _symbols(self, word: str) -> list[int]:
        """Step 2 of the module docstring: one symbol per character, or its fallback."""
        get = self.vocab.get
        if self._plain:
            ids = list(map(get, word))
            if None not in ids:
                return ids  # type: ignore[return-value]
        out: list[int] = []
        unk_pending = False  # the last symbol is an unk that a following unknown may fuse into
        last = len(word) - 1
        for k, char in enumerate(word):
            name = (self.prefix if k else "") + char + (self.suffix if k == last else "")
            i = get(name)
            if i is not None:
                out.append(i)
                unk_pending = False
                continue
            if self.byte_fallback:
                byte_ids = [self._byte_ids[b] for b in char.encode("utf-8", "surrogatepass")]
                if None not in byte_ids:
                    out.extend(byte_ids)  # type: ignore[arg-type]
                    unk_pending = False
                    continue
            if self.unk_id is not None and not (self.fuse_unk and unk_pending):
                out.append(self.unk_id)
                unk_pending = True
        return out


def _vocab(spec: Spec) -> dict[str, int]:
    vocab = spec.get("vocab", dict)
    if not all(type(i) is int and i >= 0 for i in vocab.values()):
        raise spec.error("'vocab' must map tokens to non-negative integer ids")
    if len(set(vocab.values())) != len(vocab):
        raise spec.error("two tokens of 'vocab' have the same id")
    return vocab


def _merges(spec: Spec) -> list[tuple[str, str]]:
    merges = []
    for k, item in enumerate(spec.get("merges", list, [])):
        if isinstance(item, str):
            parts = item.split(" ")
        elif isinstance(item, list) and all(isinstance(p, str) for p in item):
            parts = item
        else:
            parts = []
        if len(parts) != 2:
            raise spec.error(f"merge {k} must be \"left right\" (one space) or [left, right], "
                             f"not {shown(item)}")
        merges.append((parts[0], parts[1]))
    return merges
