"""`sheepop serve RUN --best` serves the run's best checkpoint (RUN/best/), not its latest."""

from __future__ import annotations

from serve_helpers import ServerProcess, call, make_runs, reference, weights

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

    server = ServerProcess(run, "--best", "--engine", "numpy")
    try:
        reply = call(server.url, "POST", "/v1/completions",
                     {"model": "chat", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                      "temperature": 0})
    finally:
        assert server.stop() == 0
    assert reply.status == 200, reply.text
    assert reply.json()["choices"][0]["text"] == want
    assert any("the best checkpoint of" in line and "step 5, val loss 1.2500" in line
               for line in server.lines)
