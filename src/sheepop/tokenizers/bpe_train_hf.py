"""BPE merges learned by Hugging Face `tokenizers` (the optional `--backend hf` of training).

The corpus is pre-split exactly as sheepop's own trainer splits it (special tokens cut out, then a
`Split` on sheepop's pattern, then `ByteLevel`, which only maps bytes to printable characters);
its BPE trainer then counts and merges in Rust. The merges come back as byte pairs in rank order,
so `BPETokenizer.from_merged_bytes` builds a tokenizer in sheepop's own id layout and file format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence

from sheepop.errors import UserError
from sheepop.tokenizers.pretokenize import str_to_token
from sheepop.tokenizers.special_matcher import SpecialMatcher


def _ordinary_pieces(texts: Iterable[str], special_tokens: Sequence[str]) -> Iterator[str]:
    """The corpus with special tokens cut out, as sheepop's own trainer sees it."""
    matcher = SpecialMatcher({t: k for k, t in enumerate(special_tokens)})
    for text in texts:
        for piece, special in matcher.split(text):
            if special is None:
                yield piece


def train_merges_hf(texts: Iterable[str], n_tokens: int, pattern: str,
                    special_tokens: Sequence[str], progress: bool = False
                    ) -> list[tuple[bytes, bytes]]:
    """Merges (as byte pairs, in rank order) learned by Hugging Face's BPE trainer on the
    same pre-split, up to `n_tokens` tokens (256 bytes included). Its tie-break differs from
    sheepop's, so the merges can differ where two pairs have the same count."""
    try:
        from tokenizers import Regex, models, pre_tokenizers, trainers
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise UserError("--backend hf needs the `tokenizers` package "
                        "(pip install tokenizers)") from None
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=n_tokens, show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    pieces = _ordinary_pieces(texts, special_tokens)
    first = next(pieces, None)
    if first is None:
        raise UserError("cannot train a bpe tokenizer on an empty corpus")
    hf.train_from_iterator(_chain(first, pieces), trainer=trainer)
    merges = json.loads(hf.to_str())["model"]["merges"]
    out = []
    for m in merges:
        left, right = m.split(" ") if isinstance(m, str) else m
        out.append((str_to_token(left), str_to_token(right)))
    return out  # type: ignore[return-value]


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest
