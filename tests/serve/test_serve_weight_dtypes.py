"""`sheepop serve --dtype int8` serves the int8 model (sheepop.model.quantized): the completion is
the int8 model's own greedy text, and the log-probability of its first token is the int8
model's, not float32's."""

from __future__ import annotations

import numpy as np
from serve_helpers import ServerProcess, call, reference

from sheepop.inference.load import load

PROMPT, MAX_TOKENS = "abc d", 8


def test_serve_takes_the_int8_dtype(runs):
    run = runs[1]  # the plain run: rope, no template
    int8 = load(run, "torch", "cpu", "int8")
    ids = int8.tokenizer.encode(PROMPT)
    want = reference(int8, ids, MAX_TOKENS)
    server = ServerProcess(run, "--dtype", "int8")
    try:
        reply = call(server.url, "POST", "/v1/completions",
                     {"model": "plain", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                      "temperature": 0, "logprobs": 1})
    finally:
        assert server.stop() == 0
    assert reply.status == 200, reply.text
    assert reply.json()["choices"][0]["text"] == want
    first = reply.json()["choices"][0]["logprobs"]["token_logprobs"][0]
    logprob = {}
    for dtype in ("float32", "int8"):
        lm = load(run, "torch", "cpu", dtype).lm
        logits = lm.prefill(ids).astype(np.float64)
        logits[list(lm.never_generate)] = -np.inf  # never drawn, out of the distribution
        logprob[dtype] = -np.log(np.exp(logits - logits.max()).sum())  # the greedy token's
    assert abs(first - logprob["int8"]) < 1e-5 < abs(first - logprob["float32"]), (first, logprob)
