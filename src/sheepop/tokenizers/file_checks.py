"""The checks every tokenizer kind's reader shares on a sheepop tokenizer file
(sheepop.tokenizers.base: the format): each refusal is one message naming the file and what in
it is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sheepop.errors import UserError

MAX_TOKEN_ID = 2**24 - 1
"""The largest token id a file may give: 64 times the largest vocabulary of a published model
(Gemma 3's 262,144). A table indexed by id is sized by the largest one, so an id of 10^12 in a
hostile file must be refused before it is (it asked for 8 TB; 500,000,000 took 3.9 GB)."""


def bad_file(where: str, what: str) -> UserError:
    return UserError(f"{where}: not a valid sheepop tokenizer file ({what})")


def read_specials(data: Mapping[str, Any], where: str) -> dict[str, int]:
    specials = data.get("special_tokens", {})
    if not isinstance(specials, dict) or not all(
            isinstance(k, str) and k and type(v) is int for k, v in specials.items()):
        raise bad_file(where, "special_tokens must map token strings to integer ids")
    return specials


def leading_and_added(specials: Mapping[str, int], n_ordinary: int, where: str
                      ) -> tuple[list[str], list[str]]:
    """For kinds whose ordinary tokens follow the special tokens (char, word): the special
    tokens before them (ids 0..k-1) and those added after them (ids k + n_ordinary, ...), each
    list in id order; every id of the vocabulary must be used exactly once."""
    order = sorted(specials, key=specials.__getitem__)
    lead = 0
    while lead < len(order) and specials[order[lead]] == lead:
        lead += 1
    check_ids_dense([*specials.values(), *range(lead, lead + n_ordinary)], where)
    return order[:lead], order[lead:]


def check_ids_dense(ids: Iterable[int], where: str) -> None:
    """The ids of a vocabulary (special ones included) must be exactly 0..n-1, each once."""
    ids = list(ids)
    if sorted(ids) != list(range(len(ids))):
        raise bad_file(where, "token ids must be exactly 0..vocab_size-1, each used once")


def check_id_range(ids: Iterable[int], where: str) -> None:
    """Every id within 0..MAX_TOKEN_ID, checked before anything is sized by the largest."""
    for i in ids:
        if not 0 <= i <= MAX_TOKEN_ID:
            raise UserError(f"{where}: token id {i} is outside 0..{MAX_TOKEN_ID:,} (no "
                            "vocabulary is that large)")
