"""Arithmetic progressions: generate them, write them as text, read them back.

A progression is a, a + d, a + 2d, ..., a + (n-1)d. Written as text, every term is left-padded
with zeros to a fixed width of D digits and terms are separated by single spaces, one sequence
per line:

    00042 00049 00056 00063

A data directory holds:

- `dataset.txt`   `count` in-distribution sequences; the last `heldout` lines are held out
                  (never trained on) and their (first term, difference) pairs appear nowhere
                  else, so a held-out sequence is never a prefix or a copy of a training one;
- `ood_*.txt`     held-out sets beyond the training ranges (`ood_sets`): larger differences
                  (`ood_difference` 501-1000, `ood_difference_large` 1001-5000), more terms
                  (`ood_length`, 101-150), larger first terms (`ood_first_term`), and numbers
                  with more digits than D (`ood_digits_6`, `ood_digits_7` for D = 5);
- `vocab.txt`     the 11 tokens in id order: '0'..'9', then the space (a line holding one space);
- `meta.json`     the spec, D, the split and what each file holds (`sets`: each set's ranges
                  and width).

D is the smallest width that holds the largest in-distribution term, unless given; a D that
cannot hold a term is an error, never a silent overflow. Out-of-distribution sequences are drawn
so that every term fits in D digits (a large-difference sequence gets fewer terms, a long one is
drawn again; meta.json says how often).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.errors import UserError
from sheepop.files import (
    DocumentFormat,
    atomic_write_text,
    read_bytes,
    read_document,
    write_document,
)
from sheepop.progression.ood import draw_set, ood_sets
from sheepop.progression.spec import Spec
from sheepop.tokenizers.digits import ALPHABET

FORMAT = "sheepop-progressions"
VERSION = 1
META_DOCUMENT = DocumentFormat(FORMAT, VERSION, "sheepop-progressions data file")
DATASET_FILE = "dataset.txt"
VOCAB_FILE = "vocab.txt"
META_FILE = "meta.json"
OOD_FILES = {"ood_difference": "ood_difference.txt", "ood_length": "ood_length.txt"}
"""The sets of a directory whose meta.json does not list its sets (written before they were)."""


def terms_of(first: int, difference: int, n_terms: int) -> np.ndarray:
    """a + i d for i = 0 .. n-1, as int64."""
    return first + difference * np.arange(n_terms, dtype=np.int64)


def width_for(value: int) -> int:
    """Digits needed to write a non-negative integer (at least 1)."""
    return len(str(int(value)))


def format_sequence(terms: np.ndarray, digits: int) -> str:
    return " ".join(f"{int(v):0{digits}d}" for v in terms)


@dataclass
class Progressions:
    """The sequences of one data directory, each an int64 array of its terms."""

    digits: int
    train: list[np.ndarray]
    heldout: list[np.ndarray]
    ood: dict[str, list[np.ndarray]]
    meta: dict[str, Any]
    ood_digits: dict[str, int] = field(default_factory=dict)  # a set's width, when not D

    def digits_of(self, name: str) -> int:
        """The width of the terms of set `name` (D unless the set is wider)."""
        return self.ood_digits.get(name, self.digits)


class _PairDraw:
    """Distinct (first, difference) pairs, drawn in a seeded order."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.used = rng, set()

    def draw(self, first: tuple[int, int], diff: tuple[int, int]) -> tuple[int, int]:
        for _ in range(10_000):
            a = int(self.rng.integers(first[0], first[1] + 1))
            d = int(self.rng.integers(diff[0], diff[1] + 1))
            if (a, d) not in self.used:
                self.used.add((a, d))
                return a, d
        raise UserError("could not draw distinct (first term, difference) pairs: widen the "
                        "ranges")


def generate(spec: Spec) -> tuple[int, list[np.ndarray], dict[str, list[np.ndarray]], dict]:
    """Draw the sequences: (D, in-distribution sequences, OOD sets, notes for meta.json)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    pairs = _PairDraw(rng)
    first, diff = (spec.first_min, spec.first_max), (spec.min_difference, spec.max_difference)
    sequences = []
    for _ in range(spec.count):
        a, d = pairs.draw(first, diff)
        n = int(rng.integers(spec.min_terms, spec.max_terms + 1))
        sequences.append(terms_of(a, d, n))
    largest = max(int(s[-1]) for s in sequences)
    digits = spec.digits or width_for(largest)
    if width_for(largest) > digits:
        raise UserError(f"--digits {digits} cannot hold the largest term {largest} "
                        f"(it needs {width_for(largest)} digits)")
    ood, notes = {}, {"largest_term": largest, "sets": {}}
    for name, how in ood_sets(spec, digits).items():
        ood[name], misfits = draw_set(rng, pairs, how, spec.ood_count)
        notes["sets"][name] = {"digits": how.digits, "first_terms": list(how.first),
                               "differences": list(how.difference), "terms": list(how.terms),
                               ("draws_redrawn_to_fit_digits" if how.redraw else
                                "draws_shortened_to_fit_digits"): misfits}
    return digits, sequences, ood, notes


def write_dataset(out_dir: str | Path, spec: Spec) -> dict[str, Any]:
    """Generate and write a data directory; return its meta.json contents."""
    digits, sequences, ood, notes = generate(spec)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory")
    n_heldout = max(1, round(spec.count * spec.heldout))
    meta = {"digits": digits, "spec": asdict(spec),
            "count": spec.count, "train": spec.count - n_heldout, "heldout": n_heldout,
            "split": f"the last {n_heldout} lines of {DATASET_FILE} are held out",
            "files": {"dataset": DATASET_FILE, **{name: f"{name}.txt" for name in ood}},
            **notes}
    lines = "".join(format_sequence(s, digits) + "\n" for s in sequences)
    atomic_write_text(out / DATASET_FILE, lines)
    for name, sets in ood.items():
        width = notes["sets"][name]["digits"]
        atomic_write_text(out / f"{name}.txt", "".join(format_sequence(s, width) + "\n"
                                                       for s in sets))
    atomic_write_text(out / VOCAB_FILE, "".join(c + "\n" for c in ALPHABET))
    write_document(out / META_FILE, META_DOCUMENT, meta)
    return {"format": FORMAT, "version": VERSION, **meta}


def parse_sequences(text: str, digits: int, where: str) -> list[np.ndarray]:
    """Lines of D-digit terms separated by single spaces, each an arithmetic progression."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        fields = line.split(" ")
        if len(fields) < 2 or any(len(f) != digits or not f.isdigit() or not f.isascii()
                                  for f in fields):
            raise UserError(f"{where}:{number}: expected at least two {digits}-digit terms "
                            "separated by single spaces")
        terms = np.array([int(f) for f in fields], dtype=np.int64)
        if len(set(np.diff(terms).tolist())) != 1:
            raise UserError(f"{where}:{number}: not an arithmetic progression")
        out.append(terms)
    return out


def load_progressions(data_dir: str | Path) -> Progressions:
    """Read a directory written by `write_dataset` (or by hand in the same format)."""
    root = Path(data_dir)
    meta_path = root / META_FILE
    if not root.is_dir():
        raise UserError(f"progression data directory not found: {root}")
    meta = read_document(meta_path, META_DOCUMENT, f"{root} holds no {META_FILE}: make it "
                         "with `sheepop progression generate --out DIR`")
    try:
        digits, n_heldout = int(meta["digits"]), int(meta["heldout"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{meta_path} lacks 'digits' or 'heldout'") from None

    def read(file: str, width: int = digits) -> list[np.ndarray]:
        path = root / file
        data = read_bytes(path, f"{path} is missing")
        if not data.isascii():
            raise UserError(f"{path} holds characters other than digits and spaces")
        return parse_sequences(data.decode("ascii"), width, str(path))

    sequences = read(DATASET_FILE)
    if not 0 < n_heldout < len(sequences):
        raise UserError(f"{meta_path}: heldout {n_heldout} does not split the "
                        f"{len(sequences)} sequences of {DATASET_FILE}")
    listed = meta.get("sets")
    if not isinstance(listed, dict):  # an older directory: the two sets it may hold
        listed = {name: {"digits": digits} for name, file in OOD_FILES.items()
                  if (root / file).exists()}
    ood, widths = {}, {}
    for name, about in listed.items():
        try:
            widths[name] = int(about["digits"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{meta_path}: set {name!r} lacks its 'digits'") from None
        if not name.replace("_", "").isalnum() or not 0 < widths[name] <= 18:
            raise UserError(f"{meta_path}: bad set {name!r} ({widths[name]} digits)")
        ood[name] = read(f"{name}.txt", widths[name])
    return Progressions(digits, sequences[:-n_heldout], sequences[-n_heldout:], ood, meta,
                        {k: w for k, w in widths.items() if w != digits})
