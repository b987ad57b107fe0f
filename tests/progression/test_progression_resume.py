"""A progression run stopped and resumed trains exactly as an uninterrupted one."""

import json

from sheepop.cli.common import run_config
from sheepop.config.build import build_config
from sheepop.progression.data import Spec, load_progressions, write_dataset
from sheepop.progression.task import TaskOptions, train

SETTINGS = ["model.n_layer=1", "model.n_embd=16", "train.batch_size=8", "train.decay_steps=10",
            "train.warmup_steps=2", "train.eval_interval=5", "train.log_interval=1",
            "train.checkpoint_interval=0", "train.threads=1"]


def losses(run_dir):
    return [(r["step"], r["loss"], r.get("val_loss"))
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def test_resume_continues_the_same_batches(tmp_path):
    write_dataset(tmp_path / "data", Spec(count=120, first_max=99, max_difference=9,
                                          max_terms=12, ood_count=2))
    data = load_progressions(tmp_path / "data")
    opts = TaskOptions(data.digits, window_terms=4, reverse_digits=True)
    quiet = {"progress": False, "log": lambda *_: None}
    train(data, build_config("progression", None, SETTINGS + ["train.steps=10"]), opts,
          tmp_path / "straight", **quiet)
    train(data, build_config("progression", None, SETTINGS + ["train.steps=5"]), opts,
          tmp_path / "resumed", **quiet)
    cfg = run_config(tmp_path / "resumed", ["train.steps=10"])
    other = TaskOptions(data.digits, window_terms=5)  # ignored: the run's own options win
    train(data, cfg, other, tmp_path / "resumed", resume=True, **quiet)
    assert [s for s, _, _ in losses(tmp_path / "resumed")] == list(range(1, 11))
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    assert TaskOptions.load(tmp_path / "resumed") == opts
