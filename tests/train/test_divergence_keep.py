"""A diverging run keeps its last good checkpoint (sheepop.train.divergence): after 20 sound
steps, a resume at train.lr=1e6 blows the weights up in one update; that update is never saved
(its next step shows it), the step-20 checkpoint stays byte for byte, and the advice in the
message (a lower learning rate, the same limit) continues the run. The last save of a run, which
no step follows, is probed on its own batch; a checkpoint that a sound step never followed (an
earlier sheepop's) is named as one that cannot be continued."""

from __future__ import annotations

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def good_run(tmp_path, tiny_config, tiny_trainer):
    """20 sound steps, checkpoint at 10 and 20; the step-20 model's bytes."""
    run = tmp_path / "run"
    tiny_trainer(tiny_config(steps=20, eval_interval=0, checkpoint_interval=10), run).run()
    return run, (run / checkpoint.MODEL_FILE).read_bytes()


def _largest(run) -> float:
    return max(float(np.abs(w).max()) for w in checkpoint.load_weights(run).values())


def test_a_blown_up_update_is_not_saved_and_the_advice_continues(good_run, tiny_config,
                                                                 tiny_trainer):
    run, model20 = good_run
    assert _largest(run) < 10
    spike = tiny_trainer(tiny_config(steps=40, lr=1e6, eval_interval=0, checkpoint_interval=1),
                         run, resume=True)
    with pytest.raises(UserError) as e:
        spike.run()
    message = str(e.value)
    assert message.startswith("training diverged at step 22: the gradient norm reached "), message
    assert (f"the checkpoint in {run} is still that of step 20 (its next step was sound): "
            f"continue from it with a lower learning rate, e.g. `sheepop train --resume --out "
            f"{run} --set train.lr=100000`" in message)
    assert "max_grad_norm=0" not in message
    assert (run / checkpoint.MODEL_FILE).read_bytes() == model20  # step 21 never written
    assert checkpoint.load_trainer_state(run)[1]["step"] == 20
    # The advice, at a sane learning rate, with the default limit: it trains on.
    tiny_trainer(tiny_config(steps=24, eval_interval=0, checkpoint_interval=1), run,
                 resume=True).run()
    assert checkpoint.load_trainer_state(run)[1]["step"] == 24
    assert _largest(run) < 10


def test_the_last_save_is_probed_on_its_own_batch(good_run, tiny_config, tiny_trainer):
    run, model20 = good_run
    last = tiny_trainer(tiny_config(steps=21, lr=1e6, eval_interval=0, checkpoint_interval=1),
                        run, resume=True)
    with pytest.raises(UserError, match=r"^training diverged at step 21: the update took the "
                                        r"loss on its own batch from \d.* to .*; nothing was "
                                        r"saved after it; the checkpoint .* step 20"):
        last.run()
    assert (run / checkpoint.MODEL_FILE).read_bytes() == model20
    # A sound last step is saved as before.
    tiny_trainer(tiny_config(steps=21, eval_interval=0), run, resume=True).run()
    assert checkpoint.load_trainer_state(run)[1]["step"] == 21


def test_a_checkpoint_no_sound_step_followed_is_named_as_such(good_run, tiny_config,
                                                              tiny_trainer):
    run, _ = good_run
    # What an earlier sheepop saved after a blown-up update: weights 1e5 times too large.
    arrays, state = checkpoint.load_trainer_state(run)
    weights = {k: v * 1e5 for k, v in checkpoint.load_weights(run).items()}
    checkpoint.save_checkpoint(run, weights, checkpoint.load_config(run),
                               checkpoint.load_tokenizer_json(run), arrays, state)
    resumed = tiny_trainer(tiny_config(steps=24, eval_interval=0, checkpoint_interval=1), run,
                           resume=True)
    with pytest.raises(UserError) as e:
        resumed.run()
    assert str(e.value).startswith("training diverged at step 21: "), str(e.value)
    assert (f"the checkpoint in {run} (step 20) holds weights that give this at any learning "
            "rate, so it cannot be continued: start a new run (another --out) with a lower "
            "train.lr" in str(e.value))
    assert "--resume" not in str(e.value)
