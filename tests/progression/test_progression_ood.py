"""The harder held-out sets end to end: wider numbers get fewer context terms, a perfect rule
scores 100% on every set, the failure analysis counts carries exactly, and a model with digit
places writes the same tokens in both engines on numbers wider than any it trained on."""

from types import SimpleNamespace

import numpy as np
import pytest

from sheepop.config.build import build_config
from sheepop.inference.load import build, read_run
from sheepop.progression.analysis import carries, error_tables, longest_run
from sheepop.progression.data import Spec, load_progressions, write_dataset
from sheepop.progression.evaluate import context_terms, predict_next_terms, prefixes
from sheepop.progression.report import evaluate_sets
from sheepop.progression.stream import SPACE_ID, term_digits
from sheepop.progression.task import TaskOptions, train


class PerfectRule:
    """Continues the last two terms of its context exactly (t + (t - s)), whatever the width
    of the terms: what a model that learned the rule would write."""

    def greedy(self, contexts: np.ndarray, n_new: int) -> np.ndarray:
        out = []
        for row in contexts:
            ends = np.flatnonzero(row == SPACE_ID)  # each term is followed by a space
            terms = np.split(row, ends + 1)[:-1]
            values = [int("".join(map(str, t[:-1][::-1]))) for t in terms]  # reversed digits
            nxt = 2 * values[-1] - values[-2] if len(values) > 1 else values[-1]  # k = 1: guess
            out.append(term_digits(np.array(nxt), n_new, True))
        return np.array(out)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ood")
    write_dataset(root, Spec(count=300, first_max=99, max_difference=20, min_terms=6,
                             max_terms=20, ood_count=12, seed=2))
    return root


def test_context_terms_shrink_for_wider_numbers():
    opts = TaskOptions(digits=5, window_terms=4)  # block 23
    assert [context_terms(opts, d) for d in (5, 6, 7, 8)] == [3, 2, 2, 0]


def test_a_perfect_rule_scores_every_set_exactly(data_dir):
    data = load_progressions(data_dir)
    opts = TaskOptions(data.digits, window_terms=4, reverse_digits=True)
    model = SimpleNamespace(lm=PerfectRule(), engine="rule")
    report = evaluate_sets(model, data, opts)
    assert report["sets"]["ood_digits_5"]["skipped"]  # D = 3: two 5-digit terms do not fit
    for name, s in report["sets"].items():
        if name != "ood_digits_5":
            assert s["next_term_accuracy"] == 1.0 and s["prefixes"] > 0, name
            assert sum(s["analysis"]["by_wrong_digits"].values()) == 0


def test_carries_and_chains_exact():
    # 0199 + 0001: units, tens and hundreds carry; 0450 + 0050: the tens carry; 1234 + 0001: none
    c = carries(np.array([199, 450, 1234]), np.array([1, 50, 1]), 4)
    assert c.tolist() == [[True, True, False, False], [False, True, False, False],
                          [False, False, False, False]]
    assert longest_run(c).tolist() == [2, 1, 0]
    assert longest_run(np.array([[True, False, True, True, True]])).tolist() == [3]


def test_error_tables_of_hand_made_predictions():
    seqs = [np.array([100, 700, 1300, 1900]), np.array([5, 10, 15])]  # d = 600 and d = 5
    pre, _, _ = prefixes(seqs)
    truth = term_digits(pre.target, 4)
    predicted = truth.copy()
    predicted[1, 1] = 9  # 1300 written 1900: the hundreds digit of a d = 600 prefix (k = 2)
    tables = error_tables(pre, predicted, truth)
    assert tables["by_hundreds"]["6"]["n"] == 2  # k = 2 and 3 of the first sequence
    assert tables["by_hundreds"]["6"]["next_term_accuracy"] == 0.5
    assert tables["by_hundreds"]["6"]["digit_error_by_position"] == [0.0, 0.5, 0.0, 0.0]
    assert tables["by_hundreds"]["0"] == {"n": 1, "next_term_accuracy": 1.0,
                                          "digit_error_by_position": [0.0] * 4}
    assert tables["by_wrong_digits"]["1"] == 1 and tables["first_wrong_position"]["2"] == 1
    # 700 + 600 carries out of the hundreds (chain 1); 1300 + 600 does not (chain 0)
    assert set(tables["by_carry_chain"]) == {"0", "1"}


def test_digit_places_write_the_same_tokens_in_both_engines(data_dir, tmp_path):
    data = load_progressions(data_dir)
    cfg = build_config("progression", None, [
        "model.n_layer=1", "model.n_embd=16", "model.pos_encoding=none",
        "model.digit_positions=8", "model.digit_offset=3", "model.term_positions=5",
        "train.steps=20", "train.batch_size=16", "train.eval_interval=20",
        "train.log_interval=10", "train.checkpoint_interval=0", "train.threads=1"])
    opts = TaskOptions(data.digits, window_terms=4, reverse_digits=True)
    train(data, cfg, opts, tmp_path / "run", progress=False, log=lambda *_: None)
    run_cfg, tokenizer, weights = read_run(tmp_path / "run")
    assert (run_cfg.model.digit_positions, run_cfg.model.term_positions) == (8, 5)
    assert weights["digit_emb.weight"].shape == (8, 16) and "digit_emb.terms" in weights
    seqs = data.ood["ood_digits_4"][:6]  # wider than the training numbers
    outs = [predict_next_terms(build(run_cfg, weights, tokenizer, engine).lm, seqs, opts,
                               digits=4)[1] for engine in ("torch", "numpy")]
    assert outs[0].shape[1] == 4 and np.array_equal(outs[0], outs[1])
