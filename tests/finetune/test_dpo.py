"""`sheepop finetune --method dpo`: the loss's gradient against float64 finite differences and
autograd, its sign, the engines equal on one batch of pairs, a reference that stays where it
started while the policy moves, bad pairs refused in one line, and a tiny run whose held-out
reward accuracy rises (full and LoRA, both engines)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sheepop.cli import main
from sheepop.finetune.dpo import REFERENCE_FILE, DpoEngine, Reference, pair_rows
from sheepop.finetune.dpo_loss import dpo_loss
from sheepop.finetune.run import finetune

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog")
# The preference to learn: the words asked for, not their letters backwards ("fox dog", not
# "god xof"), on prompts it has not seen for the held-out pairs.
PAIRS = [{"prompt": f"say {a} {b}", "chosen": f"{a} {b}", "rejected": f"{a} {b}"[::-1]}
         for a in WORDS for b in WORDS if a != b]
PAIRS += [{"messages": [{"role": "user", "content": f"say {w} please"}], "chosen": w,
           "rejected": w[::-1]} for w in WORDS if w != w[::-1]]


def torch_dpo_loss(c, r, rc, rr, beta):
    return -torch.nn.functional.logsigmoid(beta * ((c - rc) - (r - rr))).mean()


def test_the_dpo_gradient_is_the_derivative():
    rng = np.random.default_rng(0)
    c, r, rc, rr = (rng.standard_normal(5) * 4 - 10 for _ in range(4))
    out = dpo_loss(c, r, rc, rr, beta=0.3)
    tc, tr = torch.tensor(c, requires_grad=True), torch.tensor(r, requires_grad=True)
    expected = torch_dpo_loss(tc, tr, torch.tensor(rc), torch.tensor(rr), 0.3)
    expected.backward()
    assert out.loss == pytest.approx(expected.item(), rel=1e-14)
    np.testing.assert_allclose(out.d_chosen, tc.grad.numpy(), rtol=1e-13)
    np.testing.assert_allclose(out.d_rejected, tr.grad.numpy(), rtol=1e-13)
    h = 1e-6
    for i in range(5):
        for values, grad in ((c, out.d_chosen), (r, out.d_rejected)):
            keep = values[i]
            values[i] = keep + h
            up = dpo_loss(c, r, rc, rr, 0.3).loss
            values[i] = keep - h
            down = dpo_loss(c, r, rc, rr, 0.3).loss
            values[i] = keep
            assert grad[i] == pytest.approx((up - down) / (2 * h), rel=1e-7)
    # the sign: raising the chosen answer's log-probability lowers the loss, the rejected's
    # raises it, and the margin is the implicit rewards' difference
    assert np.all(out.d_chosen < 0) and np.all(out.d_rejected > 0)
    np.testing.assert_allclose(out.margins, 0.3 * ((c - rc) - (r - rr)))
    # a pair ranked far the right way pulls no more (and nothing overflows)
    far = dpo_loss(np.array([0.0]), np.array([-1e4]), np.zeros(1), np.zeros(1), 1.0)
    assert far.loss == 0.0 and far.d_chosen[0] == 0.0


@pytest.fixture
def base(tmp_path, tiny_config, tiny_trainer):
    """A 2-layer char model trained 12 steps on the tiny text, and a pairs file."""
    root = tmp_path / "dpo"
    cfg = tiny_config("torch", dropout=0.0)
    cfg.set("model.block_size", 48)
    cfg.set("data.val_fraction", 0.25)  # (the fine-tune's split: 16 pairs held out)
    tiny_trainer(cfg, root / "base").run()
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return root


SETTINGS = ["train.batch_size=8", "train.eval_batches=1", "train.eval_interval=10",
            "train.log_interval=1", "train.warmup_steps=2", "train.device=cpu",
            "train.dtype=float32", "finetune.method=dpo",
            "finetune.beta=0.5", "train.lr=1e-2", "train.min_lr=0", "train.decay_steps=40"]


def run_dpo(base, out, steps=40, engine="torch", lora_rank=0, resume=False):
    lines = []
    values = {"train.steps": steps, "train.engine": engine}
    if lora_rank:
        values.update({"lora.rank": lora_rank, "lora.targets": "qkv,proj,fc,down"})
    settings = [s for s in SETTINGS if not (resume and s.startswith("finetune."))]
    summary = finetune(None if resume else str(base / "base"),
                       None if resume else str(base / "pairs.jsonl"), out,
                       overrides=settings, values=values,
                       resume=resume, log=lines.append, progress=False)
    return summary, lines


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("engine,lora_rank", [("torch", 0), ("torch", 8), ("numpy", 8)])
def test_held_out_reward_accuracy_rises_and_the_reference_stays(base, tmp_path, engine,
                                                               lora_rank):
    out = tmp_path / "run"
    summary, lines = run_dpo(base, out, engine=engine, lora_rank=lora_rank)
    assert summary.steps == 40
    assert any(line.startswith("reference: log pi_ref of") for line in lines), lines
    rows = metrics(out)
    evals = [r for r in rows if "reward_accuracy" in r]
    assert [r["step"] for r in evals] == [10, 20, 30, 40]
    assert evals[-1]["reward_accuracy"] >= 0.8, evals
    assert evals[-1]["reward_accuracy"] > evals[0]["reward_accuracy"] or evals[0][
        "reward_accuracy"] == 1.0, evals
    assert evals[-1]["reward_margin"] > evals[0]["reward_margin"] > 0, evals
    assert evals[-1]["val_loss"] < np.log(2)  # the loss at the reference, margin 0
    # The reference kept in the run is the model before training's, not the policy's: the
    # base run's log-probabilities of the same answers.
    kept = json.loads((out / REFERENCE_FILE).read_text())["log_probs"]
    assert len(kept) == len(PAIRS)
    pairs, fresh = reference_of_the_base(base, engine)
    np.testing.assert_allclose(kept, fresh.values, rtol=1e-5)
    trained = trained_engine(base, out, engine)
    x, y = pair_rows(pairs, 0)
    policy = trained.engine.token_logprobs(x, y).sum(-1).reshape(-1, 2)
    assert np.abs(policy - fresh.values).max() > 0.1  # the policy did move away from it


def test_a_resumed_run_compares_with_the_kept_reference(base, tmp_path):
    out = tmp_path / "run"
    run_dpo(base, out, steps=20)
    kept = (out / REFERENCE_FILE).read_text()
    summary, lines = run_dpo(base, out, steps=25, resume=True)
    assert summary.steps == 25 and (out / REFERENCE_FILE).read_text() == kept
    assert not any(line.startswith("reference:") for line in lines)  # read, not computed
    rows = {r["step"]: r for r in metrics(out)}
    # the policy's own weights as the reference would put every margin at 0 and the loss at
    # ln 2; against the kept one the learnt pairs stay learnt
    assert rows[21]["loss"] < 0.5 * np.log(2), rows[21]
    assert rows[25]["reward_accuracy"] >= 0.8


def test_the_summary_gives_the_preference_figures_not_a_perplexity(base, tmp_path, capsys):
    """`sheepop finetune --method dpo` ends with the held-out pairs' DPO loss, reward accuracy
    and margin, those of its last evaluation: exp of a DPO loss is no perplexity."""
    out = tmp_path / "run"
    sets = [a for s in SETTINGS if not s.startswith("finetune.") for a in ("--set", s)]
    assert main(["finetune", str(base / "base"), "--data", str(base / "pairs.jsonl"),
                 "--method", "dpo", "--beta", "0.5", "--steps", "10", "--out", str(out),
                 "--no-progress", *sets]) == 0
    shown = capsys.readouterr().out
    last = metrics(out)[-1]
    assert last["step"] == 10 and "val_perplexity" not in last
    assert "perplexity" not in shown, shown
    summary = [line for line in shown.splitlines() if line.startswith("train loss ")]
    assert summary == [f"train loss {last['loss']:.4f}, held-out pairs: DPO loss "
                       f"{last['val_loss']:.4f}, reward accuracy "
                       f"{last['reward_accuracy']:.3f}, reward margin "
                       f"{last['reward_margin']:.4f} (16 pairs)"], shown
    assert last["reward_accuracy"] > 0 and last["reward_margin"] > 0  # (a run that moved)


def reference_of_the_base(base, engine):
    """The pairs and the base model's log-probabilities of their answers."""
    from sheepop.finetune.pairs import read_pairs
    from sheepop.finetune.run import base_model
    from sheepop.train.start import make_engine
    cfg, tokenizer, weights, _ = base_model(base / "base")
    cfg.set("train.engine", engine)
    cfg.set("train.device", "cpu")
    pairs = read_pairs(base / "pairs.jsonl", tokenizer, cfg.model.block_size)
    from sheepop.finetune.run import split_examples
    train, val = split_examples(pairs, cfg.data.val_fraction, cfg.train.seed)
    ordered = [*train, *val]  # the run's order
    return ordered, Reference.computed(make_engine(cfg, weights), ordered, 4,
                                       tokenizer.pad_id or 0, False)


def trained_engine(base, out, engine) -> DpoEngine:
    from sheepop.inference.load import read_run
    from sheepop.train.start import make_engine
    cfg, _, weights = read_run(out)
    cfg.set("train.engine", engine)
    cfg.set("train.device", "cpu")
    pairs, fresh = reference_of_the_base(base, engine)
    return DpoEngine(make_engine(cfg, weights), fresh, 0.5)


def test_the_engines_agree_on_one_batch_of_pairs(base):
    from sheepop.finetune.run import base_model
    from sheepop.train.start import make_engine
    pairs, reference = reference_of_the_base(base, "torch")
    cfg, _, weights, _ = base_model(base / "base")
    x, y = pair_rows(pairs[:6], 0)
    out = {}
    for engine in ("torch", "numpy"):
        cfg.set("train.engine", engine)
        dpo = DpoEngine(make_engine(cfg, weights), reference, 0.5)
        loss, norm = dpo.train_step([(x, y)], 1e-2)
        out[engine] = loss, norm, dpo.margins(x, y)
    assert out["torch"][0] == pytest.approx(np.log(2), rel=1e-6)  # at the reference
    # float32 through a 2-layer model: each engine's sums in its own order
    assert out["numpy"][0] == pytest.approx(out["torch"][0], rel=1e-5)
    assert out["numpy"][1] == pytest.approx(out["torch"][1], rel=1e-3)
    np.testing.assert_allclose(out["numpy"][2], out["torch"][2], atol=2e-3)
    assert np.all(out["torch"][2] > 0)  # one step the right way: every margin positive


@pytest.mark.parametrize("line,said", [
    ({"prompt": "say fox", "rejected": "dog"}, "line 2: 'chosen' missing"),
    ({"prompt": "say fox", "chosen": " ", "rejected": "dog"}, "line 2: 'chosen' is empty"),
    ({"chosen": "fox", "rejected": "dog"}, "line 2: give either 'messages' or 'prompt'"),
    ({"prompt": "say fox", "chosen": "fox", "rejected": "fox"}, "are the same answer"),
])
def test_bad_pairs_are_refused_in_one_line(base, tmp_path, capsys, line, said):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PAIRS[0]) + "\n" + json.dumps(line) + "\n")
    status = main(["finetune", str(base / "base"), "--data", str(bad), "--method", "dpo",
                   "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("sheepop: ") and err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "out").exists()


def test_the_held_out_pairs_can_come_from_their_own_file(base, tmp_path):
    """finetune.val_data: the held-out pairs are that file's (prompts DATA never asks), every
    pair of DATA trains, and a resumed run reads the same file again."""
    held = base / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"say {w} now", "chosen": w,
                                        "rejected": w[::-1]}) + "\n"
                            for w in ("fox", "dog", "lazy")))
    out, lines = tmp_path / "run", []
    summary = finetune(str(base / "base"), str(base / "pairs.jsonl"), out,
                       overrides=[*SETTINGS, f"finetune.val_data={held}"],
                       values={"train.steps": 10}, log=lines.append, progress=False)
    assert f"preference pairs: {len(PAIRS)} in {base / 'pairs.jsonl'}" in lines, lines
    assert f"preference pairs: 3 in {held}" in lines, lines
    assert any(f"preference pairs: {len(PAIRS)} train, 3 held out" in line for line in lines)
    assert summary.lines()[1].endswith("(3 pairs)"), summary.lines()  # the held-out figures
    assert json.loads((out / "finetune.json").read_text())["val_data"] == str(held)
    # the reference holds every pair of both files, the held-out ones last
    kept = np.array(json.loads((out / REFERENCE_FILE).read_text())["log_probs"])
    assert kept.shape == (len(PAIRS) + 3, 2)
    from sheepop.finetune.pairs import read_pairs
    from sheepop.finetune.run import base_model
    from sheepop.train.start import make_engine
    cfg, tokenizer, weights, _ = base_model(base / "base")
    cfg.set("train.device", "cpu")
    fresh = Reference.computed(make_engine(cfg, weights), read_pairs(held, tokenizer, 48), 4,
                               tokenizer.pad_id or 0, False)
    np.testing.assert_allclose(kept[-3:], fresh.values, rtol=1e-5)
    lines.clear()
    summary = finetune(None, None, out, overrides=[s for s in SETTINGS
                                                   if not s.startswith("finetune.")],
                       values={"train.steps": 12}, resume=True, log=lines.append,
                       progress=False)
    assert f"preference pairs: 3 in {held}" in lines
    assert summary.lines()[1].endswith("(3 pairs)"), summary.lines()
