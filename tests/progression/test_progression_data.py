"""The generator's invariants, the file format, and the token streams."""

import json

import numpy as np
import pytest

from sheepop.errors import UserError
from sheepop.progression.data import (
    Spec,
    format_sequence,
    generate,
    load_progressions,
    parse_sequences,
    write_dataset,
)
from sheepop.progression.stream import (
    SPACE_ID,
    TermWindows,
    TermWindowSampler,
    digits_value,
    sequence_tokens,
    term_digits,
)
from sheepop.tokenizers import loads
from sheepop.tokenizers.digits import DigitsTokenizer

SPEC = Spec(count=400, ood_count=60, seed=3)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("prog")
    write_dataset(out, SPEC)
    return out


def test_every_line_is_d_digit_terms_separated_by_single_spaces(data_dir):
    meta = json.loads((data_dir / "meta.json").read_text())
    D = meta["digits"]
    # first terms up to 9999, differences up to 500, up to 100 terms: the largest term
    # a + 99 d can need 5 digits, and D is the width of the largest term actually drawn.
    assert D == len(str(meta["largest_term"])) == 5
    for name in ("dataset.txt", "ood_difference.txt", "ood_length.txt"):
        text = (data_dir / name).read_text()
        assert text.endswith("\n") and "\n\n" not in text
        for line in text.splitlines():
            assert line == line.strip() and "  " not in line
            fields = line.split(" ")
            assert all(len(f) == D and f.isdigit() for f in fields)


def test_ranges_differences_and_split(data_dir):
    data = load_progressions(data_dir)
    seqs = data.train + data.heldout
    assert len(seqs) == 400 and len(data.heldout) == 40 and len(data.train) == 360
    for s in seqs:
        assert 2 <= len(s) <= 100
        assert 0 <= s[0] <= 9999
        d = set(np.diff(s).tolist())
        assert len(d) == 1 and 1 <= d.pop() <= 500
    assert max(int(s[-1]) for s in seqs) == data.meta["largest_term"]
    # held-out (first term, difference) pairs never occur in training
    pairs = {(int(s[0]), int(s[1] - s[0])) for s in data.train}
    assert len(pairs) == 360
    assert not pairs & {(int(s[0]), int(s[1] - s[0])) for s in data.heldout}


def test_out_of_distribution_sets(data_dir):
    data = load_progressions(data_dir)
    limit = 10 ** data.digits - 1
    big, long = data.ood["ood_difference"], data.ood["ood_length"]
    assert len(big) == len(long) == 60
    assert all(501 <= s[1] - s[0] <= 1000 and 3 <= len(s) and s[-1] <= limit for s in big)
    assert all(101 <= len(s) <= 150 and 1 <= s[1] - s[0] <= 500 and s[-1] <= limit
               for s in long)
    in_dist = {(int(s[0]), int(s[1] - s[0])) for s in data.train + data.heldout}
    assert not in_dist & {(int(s[0]), int(s[1] - s[0])) for s in long}


def test_the_harder_held_out_sets(data_dir):
    data = load_progressions(data_dir)
    meta = json.loads((data_dir / "meta.json").read_text())
    assert list(meta["sets"]) == ["ood_difference", "ood_length", "ood_difference_large",
                                  "ood_first_term", "ood_digits_6", "ood_digits_7"]
    assert list(data.ood) == list(meta["sets"])
    limit = 10 ** 5 - 1
    for s in data.ood["ood_difference_large"]:
        assert 1001 <= s[1] - s[0] <= 5000 and 3 <= len(s) <= 100 and s[-1] <= limit
    for s in data.ood["ood_first_term"]:
        assert 10_000 <= s[0] <= 49_999 and 1 <= s[1] - s[0] <= 500 and s[-1] <= limit
    for width in (6, 7):
        name = f"ood_digits_{width}"
        assert data.digits_of(name) == meta["sets"][name]["digits"] == width
        assert len(data.ood[name]) == 60
        for s in data.ood[name]:  # every term has exactly `width` significant digits
            assert 10 ** (width - 1) <= s[0] and s[-1] < 10 ** width
            assert 1 <= s[1] - s[0] <= 500 and 3 <= len(s)
        line = (data_dir / f"{name}.txt").read_text().splitlines()[0].split(" ")
        assert all(len(f) == width for f in line)
    assert data.digits_of("ood_difference") == 5
    # exact values: the seeded draw of SPEC, the first sequence of each set
    firsts = {name: (seqs[0][:2].tolist(), len(seqs[0])) for name, seqs in data.ood.items()}
    assert firsts == {"ood_difference": ([4165, 5163], 19), "ood_length": ([9407, 9811], 128),
                      "ood_difference_large": ([6480, 11066], 21),
                      "ood_first_term": ([47979, 48352], 25),
                      "ood_digits_6": ([974490, 974861], 69),
                      "ood_digits_7": ([6363268, 6363379], 10)}
    assert meta["sets"]["ood_difference_large"]["draws_shortened_to_fit_digits"] == 38


def test_adding_sets_keeps_the_earlier_files(tmp_path):
    """The new sets are drawn after the old ones: the same seed writes the same dataset.txt,
    ood_difference.txt and ood_length.txt with or without them."""
    write_dataset(tmp_path / "a", SPEC)
    write_dataset(tmp_path / "b", Spec(count=400, ood_count=60, seed=3, ood_more_digits=0))
    for name in ("dataset.txt", "ood_difference.txt", "ood_length.txt", "ood_first_term.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert not (tmp_path / "b" / "ood_digits_6.txt").exists()
    # an older directory (meta.json without `sets`) still loads its two sets
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    del meta["sets"]
    (tmp_path / "b" / "meta.json").write_text(json.dumps(meta))
    assert set(load_progressions(tmp_path / "b").ood) == {"ood_difference", "ood_length"}


def test_generation_is_seeded_and_reproducible(tmp_path):
    write_dataset(tmp_path / "a", SPEC)
    write_dataset(tmp_path / "b", SPEC)
    write_dataset(tmp_path / "c", Spec(count=400, ood_count=60, seed=4))
    for name in ("dataset.txt", "ood_difference.txt", "ood_length.txt", "meta.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "dataset.txt").read_bytes() != \
        (tmp_path / "c" / "dataset.txt").read_bytes()


def test_digits_given_too_small_is_an_error_and_wider_pads(tmp_path):
    with pytest.raises(UserError, match="cannot hold the largest term"):
        generate(Spec(count=50, ood_count=0, digits=4))
    write_dataset(tmp_path, Spec(count=50, ood_count=5, digits=7, first_max=99,
                                 max_difference=9, max_terms=10))
    line = (tmp_path / "dataset.txt").read_text().splitlines()[0]
    assert all(len(f) == 7 and f.startswith("0000") for f in line.split(" "))


def test_small_ranges_and_format():
    digits, seqs, _, _ = generate(Spec(count=30, ood_count=3, first_max=9, max_difference=9,
                                       max_terms=5, min_terms=5))
    assert digits == 2  # 9 + 4 * 9 = 45
    assert format_sequence(np.array([42, 49, 56]), 4) == "0042 0049 0056"
    assert all(len(s) == 5 for s in seqs)


def test_vocab_file_lists_the_eleven_tokens(data_dir):
    lines = (data_dir / "vocab.txt").read_text().split("\n")[:-1]
    assert lines == [str(i) for i in range(10)] + [" "]


@pytest.mark.parametrize("text, message", [
    ("0042 0049 0057\n", "not an arithmetic progression"),
    ("0042  0049\n", "single spaces"),
    ("042 049\n", "4-digit"),
    ("0042\n", "at least two"),
])
def test_malformed_lines_are_user_errors(text, message):
    with pytest.raises(UserError, match=message):
        parse_sequences(text, 4, "f.txt")


def test_missing_or_foreign_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_progressions(tmp_path / "nope")
    with pytest.raises(UserError, match="meta.json"):
        load_progressions(tmp_path)
    (tmp_path / "meta.json").write_text("{\"format\": \"other\"}")
    with pytest.raises(UserError, match="not a sheepop-progressions"):
        load_progressions(tmp_path)


def test_tokenizer_round_trip_of_a_dataset_line(data_dir):
    tok = loads(DigitsTokenizer().to_json())
    for line in (data_dir / "dataset.txt").read_text().splitlines()[:50]:
        ids = tok.encode(line + " ")
        assert tok.decode(ids) == line + " "
        terms = np.array([int(f) for f in line.split(" ")])
        assert sequence_tokens(terms, 5).tolist() == ids


def test_reversed_digits_round_trip():
    values = np.array([0, 7, 42, 1234, 99999])
    assert term_digits(values, 5, reverse=True)[3].tolist() == [4, 3, 2, 1, 0]
    for reverse in (False, True):
        assert digits_value(term_digits(values, 5, reverse), reverse).tolist() == values.tolist()
    assert digits_value(np.array([[1, SPACE_ID, 3]])).tolist() == [-1]  # a space is no digit


def test_term_aligned_windows_mask_the_two_given_terms():
    w = TermWindows([np.array([42, 49, 56, 63, 70]), np.array([5, 10, 15])], digits=3, terms=4)
    assert w.block_size == 15 and len(w) == 3  # starts at terms 0 and 1, and the short one
    x, y = w.batch(np.arange(3))
    S, M = SPACE_ID, -1
    assert x.tolist() == [[0, 4, 2, S, 0, 4, 9, S, 0, 5, 6, S, 0, 6, 3],
                          [0, 4, 9, S, 0, 5, 6, S, 0, 6, 3, S, 0, 7, 0],
                          [0, 0, 5, S, 0, 1, 0, S, 0, 1, 5, S, S, S, S]]
    assert y.tolist() == [[M, M, M, M, M, M, M, 0, 5, 6, S, 0, 6, 3, S],
                          [M, M, M, M, M, M, M, 0, 6, 3, S, 0, 7, 0, S],
                          [M, M, M, M, M, M, M, 0, 1, 5, S, M, M, M, M]]
    unmasked = TermWindows([np.array([42, 49, 56, 63])], 3, 4, reverse=True, mask_given=0)
    x, y = unmasked.batch(np.array([0]))
    assert x[0, :4].tolist() == [2, 4, 0, S] and (y[0] >= 0).all()


def test_both_ways_adds_each_sequence_read_backwards():
    """--directions both: the same terms, last first (a decreasing progression, difference
    -d): no value or |difference| that the forward sequences do not have."""
    w = TermWindows([np.array([42, 49, 56, 63, 70])], digits=3, terms=4, both_ways=True)
    assert len(w) == 4  # two starts forwards, two backwards
    x, _ = w.batch(np.arange(4))
    S = SPACE_ID
    assert x[2].tolist() == [0, 7, 0, S, 0, 6, 3, S, 0, 5, 6, S, 0, 4, 9]
    assert x[3].tolist() == [0, 6, 3, S, 0, 5, 6, S, 0, 4, 9, S, 0, 4, 2]


def test_sampler_state_replays_the_same_batches():
    w = TermWindows([np.arange(0, 300, 3)], 3, 4)
    a = TermWindowSampler(w, 8, seed=5)
    a.next_batch()
    saved = json.loads(json.dumps(a.state()))
    after = a.next_batch()
    b = TermWindowSampler(w, 8, seed=99)
    b.set_state(saved)
    assert all(np.array_equal(u, v) for u, v in zip(after, b.next_batch()))
