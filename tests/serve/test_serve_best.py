"""`sheepop serve RUN --best` serves the run's best checkpoint (RUN/best/), not its latest."""

from __future__ import annotations

from serve_helpers import ServerProcess, greedy_completion, make_runs, reference, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.inference.load import load
from sheepop.train.keeping import save_best

PROMPT, MAX_TOKENS = "abc d", 8


def test_best_serves_the_best_checkpoint(tmp_path):
    run, _ = make_runs(tmp_path)
    last = load(run, "numpy")
    save_best(run, weights(last.config.model, seed=8), checkpoint.load_config(run),
              checkpoint.load_tokenizer_json(run), step=5, val_loss=1.25, val_bpb=None)
    best = load(run / checkpoint.BEST_DIR, "numpy")
    ids = best.tokenizer.encode(PROMPT)
    want = reference(best, ids, MAX_TOKENS)
    assert want != reference(last, ids, MAX_TOKENS)  # so the answer tells which was served

    with ServerProcess(run, "--best", "--engine", "numpy") as server:
        reply = greedy_completion(server, "chat", PROMPT, MAX_TOKENS)
    assert reply["choices"][0]["text"] == want
    assert any("the best checkpoint of" in line and "step 5, val loss 1.2500" in line
               for line in server.lines)
