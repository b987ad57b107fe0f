"""Scoring on hand-made predictions, batched greedy decoding against the step-by-step loop,
the derived whole-continuation accuracy against explicit rollouts, and a short training run."""

import json

import numpy as np
import pytest

from sheepop.cli import main
from sheepop.config.build import build_config
from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate
from sheepop.inference.load import build, read_run
from sheepop.progression.data import Spec, load_progressions, write_dataset
from sheepop.progression.evaluate import (
    predict_next_terms,
    prefixes,
    rollout,
    seen_in_training,
)
from sheepop.progression.scores import continuation, score
from sheepop.progression.stream import SPACE_ID, term_digits
from sheepop.progression.task import TaskOptions, train

# ----- scoring, by hand -----------------------------------------------------------------------


def test_prefixes_enumerate_every_k_with_its_target():
    pre, flat, pos = prefixes([np.array([10, 13, 16, 19]), np.array([5, 7, 9])])
    assert pre.seq.tolist() == [0, 0, 0, 1, 1]
    assert pre.k.tolist() == [1, 2, 3, 1, 2]
    assert pre.target.tolist() == [13, 16, 19, 7, 9]
    assert pre.difference.tolist() == [3, 3, 3, 2, 2]
    assert flat[pos - 1].tolist() == [10, 13, 16, 5, 7]  # the last given term


def test_continuation_is_the_and_of_every_later_prediction():
    seq = np.array([0, 0, 0, 0, 1, 1, 2])
    k = np.array([1, 2, 3, 4, 1, 2, 1])
    exact = np.array([False, True, False, True, True, True, False])
    assert continuation(seq, k, exact).tolist() == [False, False, False, True, True, True,
                                                    False]
    shuffled = np.array([3, 6, 0, 5, 1, 4, 2])  # the order of the prefixes does not matter
    assert continuation(seq[shuffled], k[shuffled], exact[shuffled]).tolist() == \
        continuation(seq, k, exact)[shuffled].tolist()


def test_score_of_hand_made_predictions():
    # Two sequences: 100 103 106 109 (d=3) and 200 350 500 (d=150); D = 3.
    pre, _, _ = prefixes([np.array([100, 103, 106, 109]), np.array([200, 350, 500])])
    truth = term_digits(pre.target, 3)
    predicted = truth.copy()
    predicted[0] = [1, 0, 0]          # k=1 of seq 0: wrong in its last digit (not a headline)
    predicted[1] = [1, 0, 7]          # k=2 of seq 0: 107 for 106, two digits right
    predicted[4] = [5, SPACE_ID, 0]   # k=2 of seq 1: a space instead of a digit
    s = score(pre, predicted, truth, largest_seen=300)
    # headline = k >= 2: seq 0 k=2 (wrong), k=3 (right); seq 1 k=2 (wrong)
    assert s["n_prefixes"] == 3 and s["n_sequences"] == 2
    assert s["next_term_accuracy"] == pytest.approx(1 / 3)
    assert s["digit_accuracy"] == pytest.approx((2 + 3 + 2) / 9)
    assert s["continuation_accuracy"] == pytest.approx(1 / 3)  # only seq 0 from k=3
    assert s["k1_next_term_accuracy"] == pytest.approx(1 / 2)
    assert s["digit_accuracy_by_position"] == pytest.approx([1, 2 / 3, 2 / 3])
    assert s["by_k"]["2"] == {"n": 2, "next_term_accuracy": 0.0,
                              "digit_accuracy": pytest.approx(4 / 6),
                              "continuation_accuracy": 0.0}
    assert s["by_k"]["3"]["next_term_accuracy"] == 1.0
    assert set(s["by_difference"]) == {"1-100", "101-200"}
    assert s["by_difference"]["101-200"]["next_term_accuracy"] == 0.0
    assert s["by_value"]["> 300"] == {"n": 1, "next_term_accuracy": 0.0,
                                      "digit_accuracy": pytest.approx(2 / 3),
                                      "continuation_accuracy": 0.0}
    assert s["curve"]["k"] == [1, 2, 3]
    assert s["curve"]["next_term_accuracy"] == [0.5, 0.0, 1.0]


def test_windows_seen_in_training_despite_distinct_pairs():
    train_seqs = [np.array([100, 107, 114, 121, 128]), np.array([3, 10, 17])]
    held = [np.array([107, 114, 121, 128, 135]), np.array([2, 9, 16])]
    opts = TaskOptions(digits=3, window_terms=4)
    # the held-out line shares its difference and residue with the first training line, so
    # every window but the one reaching 135 lies inside it; 2 9 16 shares d, not the residue
    assert seen_in_training(train_seqs, held, opts).tolist() == [True, True, True, False,
                                                                 False, False]
    pre, _, _ = prefixes(held)
    truth = term_digits(pre.target, 3)
    s = score(pre, truth, truth, window_seen=seen_in_training(train_seqs, held, opts))
    assert s["by_window"]["in training"]["n"] == 2 and s["by_window"]["never seen"]["n"] == 2


# ----- a short real training run, shared by the tests below -----------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("progression")
    write_dataset(root / "data", Spec(count=600, first_max=99, max_difference=20, min_terms=6,
                                      max_terms=20, ood_count=20, seed=1))
    data = load_progressions(root / "data")
    cfg = build_config("progression", None, [
        "model.n_layer=2", "model.n_embd=32", "train.steps=150", "train.batch_size=32",
        "train.lr=1e-2", "train.min_lr=1e-3", "train.warmup_steps=10", "train.eval_interval=75",
        "train.log_interval=1", "train.checkpoint_interval=0", "train.threads=1"])
    opts = TaskOptions(data.digits, window_terms=4, reverse_digits=True, data=str(root / "data"))
    summary = train(data, cfg, opts, root / "run", progress=False, log=lambda *_: None)
    return root, data, opts, summary


def test_a_short_training_run_lowers_the_loss(trained):
    root, data, opts, summary = trained
    assert data.digits == 3 and opts.block_size == 15
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    first, last = np.mean([r["loss"] for r in rows[:5]]), np.mean([r["loss"] for r in rows[-5:]])
    assert first > 2.0  # about ln(11) = 2.4 at the start
    assert last < first - 1.0
    assert TaskOptions.load(root / "run") == opts
    assert (root / "run" / "model.safetensors").exists()


def test_batched_greedy_matches_the_shared_generation_loop(trained):
    root, data, opts, _ = trained
    cfg, tokenizer, weights = read_run(root / "run")
    lm = build(cfg, weights, tokenizer, "torch", "cpu").lm
    rng = np.random.default_rng(0)
    contexts = rng.integers(0, 10, size=(6, 12))
    contexts[:, 3::4] = SPACE_ID
    batched = lm.greedy(contexts, 3)
    greedy = SampleConfig(max_new_tokens=3, temperature=0.0)
    for row, out in zip(contexts, batched):
        assert [s.token for s in generate(lm, row.tolist(), greedy)] == out.tolist()


def test_numpy_engine_predicts_the_same_tokens(trained):
    root, data, opts, _ = trained
    cfg, tokenizer, weights = read_run(root / "run")
    seqs = data.heldout[:10]
    _, torch_out = predict_next_terms(build(cfg, weights, tokenizer, "torch", "cpu").lm, seqs,
                                      opts)
    _, numpy_out = predict_next_terms(build(cfg, weights, tokenizer, "numpy").lm, seqs, opts)
    assert np.array_equal(torch_out, numpy_out)


class RuleOfThumb:
    """A deterministic stand-in for a model: continues the last two terms of its context
    (t + (t - s)) but writes one too many whenever the last term is a multiple of 7, so some
    continuations succeed and some fail, and a failure changes the later contexts."""

    engine = "rule"

    def __init__(self, digits: int, reverse: bool):
        self.digits, self.reverse = digits, reverse

    def greedy(self, contexts: np.ndarray, n_new: int) -> np.ndarray:
        out = []
        for row in contexts:
            terms = row.reshape(-1, self.digits + 1)[:, :-1]
            values = [int("".join(map(str, t[::-1] if self.reverse else t))) for t in terms]
            nxt = 2 * values[-1] - values[-2] if len(values) > 1 else values[-1]
            nxt += values[-1] % 7 == 0
            out.append(term_digits(np.array(nxt % 10 ** self.digits), self.digits, self.reverse))
        return np.array(out)[:, :n_new]


@pytest.mark.parametrize("reverse", [False, True])
def test_derived_continuation_equals_explicit_rollouts(reverse):
    opts = TaskOptions(digits=3, window_terms=4, reverse_digits=reverse)
    rng = np.random.default_rng(1)
    seqs = [int(a) + int(d) * np.arange(int(n)) for a, d, n in
            zip(rng.integers(0, 99, 40), rng.integers(1, 9, 40), rng.integers(3, 30, 40))]
    predictor = RuleOfThumb(3, reverse)
    pre, written = predict_next_terms(predictor, seqs, opts, batch_size=7)
    exact = (written == term_digits(pre.target, 3)).all(1)
    derived = continuation(pre.seq, pre.k, exact)
    explicit = np.array([rollout(predictor, seqs[s], int(k), opts) == seqs[s][k:].tolist()
                         for s, k in zip(pre.seq, pre.k)])
    assert np.array_equal(derived, explicit)
    assert 0.2 < explicit[pre.k >= 2].mean() < 0.8 and 0.6 < exact[pre.k >= 2].mean() < 0.95


def test_cli_eval_prints_a_table_and_a_json_line(trained, capsys):
    root, _, _, _ = trained
    assert main(["progression", "eval", str(root / "run"), "--data", str(root / "data"),
                 "--json", "--max-sequences", "15", "--threads", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert 0.0 <= report["next_term_accuracy"] <= 1.0
    # one entry per held-out set, keyed by its file's stem: D = 3 here, so the digit sets are
    # 4 and 5 digits wide, and two 5-digit terms and the answer do not fit the 15-position block
    assert set(report["sets"]) == {"heldout", "ood_difference", "ood_difference_large",
                                   "ood_first_term", "ood_length", "ood_digits_4",
                                   "ood_digits_5"}
    data = load_progressions(root / "data")
    for name, s in report["sets"].items():
        sequences = (data.heldout if name == "heldout" else data.ood[name])[:15]
        if name == "ood_digits_5":
            assert s["prefixes"] == 0 and s["next_term_accuracy"] is None and s["skipped"]
            continue
        assert s["prefixes"] == sum(len(q) - 2 for q in sequences)  # k = 2 .. n-1
        assert 0.0 <= s["next_term_accuracy"] <= 1.0
        assert s["digits"] == (4 if name == "ood_digits_4" else 3)
        assert s["context_terms"] == (2 if name == "ood_digits_4" else 3)
        hundreds = s["analysis"]["by_hundreds"]
        assert sum(row["n"] for row in hundreds.values()) == s["prefixes"]
    assert report["next_term_accuracy"] == report["sets"]["heldout"]["next_term_accuracy"]
    assert any(line.startswith("held-out (in distribution)") for line in out)
    assert (root / "run" / "progression.png").stat().st_size > 10_000


def test_cli_user_errors_exit_2(tmp_path, capsys):
    assert main(["progression", "generate", "--out", str(tmp_path / "d"), "--count", "50",
                 "--digits", "2"]) == 2
    assert "cannot hold the largest term" in capsys.readouterr().err
    assert main(["progression", "eval", str(tmp_path), "--data", str(tmp_path)]) == 2
    assert "not a progression run" in capsys.readouterr().err
    assert main(["progression", "train", str(tmp_path / "missing"), "--out",
                 str(tmp_path / "r")]) == 2
