"""`sheepop serve --dtype int8` serves the int8 model (sheepop.model.quantized on the torch engine,
sheepop.scratch.narrow on the NumPy engine): the completion is the int8 model's own greedy text,
and the log-probability of its first token is the int8 model's, not float32's."""

from __future__ import annotations

import numpy as np
import pytest
from serve_helpers import InProcess, ServerProcess, call, greedy_completion, reference

from sheepop.inference.load import load

PROMPT, MAX_TOKENS = "abc d", 8


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_serve_takes_the_int8_dtype(runs, engine):
    run = runs[1]  # the plain run: rope, no template
    int8 = load(run, engine, "cpu", "int8")
    ids = int8.tokenizer.encode(PROMPT)
    want = reference(int8, ids, MAX_TOKENS)
    with ServerProcess(run, "--dtype", "int8", "--engine", engine) as server:
        reply = greedy_completion(server, "plain", PROMPT, MAX_TOKENS, logprobs=1)
    assert reply["choices"][0]["text"] == want
    first = reply["choices"][0]["logprobs"]["token_logprobs"][0]
    logprob = {}
    for dtype in ("float32", "int8"):
        lm = load(run, engine, "cpu", dtype).lm
        logits = lm.prefill(ids).astype(np.float64)
        logits[list(lm.never_generate)] = -np.inf  # never drawn, out of the distribution
        logprob[dtype] = -np.log(np.exp(logits - logits.max()).sum())  # the greedy token's
    assert abs(first - logprob["int8"]) < 1e-5 < abs(first - logprob["float32"]), (first, logprob)


def test_serve_compiles_the_decode_step(runs):
    """`sheepop serve --compile --dtype int8` builds its model through inference.load as
    generate does: a request gets the eager int8 model's greedy text. (One row: a batch of
    several compiles a graph of its own when it first comes, a minute of this suite's loaded
    cores; docs/performance.md, "Compiled decoding on the AVX-512 Xeon".)"""
    run = runs[1]
    int8 = load(run, "torch", "cpu", "int8")
    want = reference(int8, int8.tokenizer.encode(PROMPT), MAX_TOKENS)
    with ServerProcess(run, "--dtype", "int8", "--compile", "--engine", "torch") as server:
        reply = greedy_completion(server, "plain", PROMPT, MAX_TOKENS)
    assert reply["choices"][0]["text"] == want
    assert any(line.startswith("sheepop: compile: the decode step ready in ")
               for line in server.lines), server.lines


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_step_and_backprop_views_read_the_quantized_weights(runs, dtype, engine):
    """/v1/trace and /v1/backward on a server of int8 or int4 weights: 200, computed from the
    weights the model holds, dequantized under the checkpoint's names (they answered 500: a
    quantized layer's weight is not a parameter, and the views were handed None)."""
    from sheepop.inference.weights import model_weights
    from sheepop.serve.page.routes import routes

    run = runs[1]
    model = load(run, engine, "cpu", dtype)
    weights, plain = model_weights(model), load(run, "torch", "cpu").lm.model.numpy_weights()
    assert weights.keys() == plain.keys()
    qkv = (model.lm.model.blocks[0].attn.qkv.dequantized().numpy() if engine == "torch"
           else model.lm.params["blocks.0.attn.qkv.weight"].dequantized())
    np.testing.assert_array_equal(weights["blocks.0.attn.qkv.weight"], qkv)
    error = np.abs(weights["blocks.0.attn.qkv.weight"] - plain["blocks.0.attn.qkv.weight"])
    assert 0 < error.max() < np.abs(plain["blocks.0.attn.qkv.weight"]).max() / 8  # a 4-bit step
    server = InProcess(model, routes=routes(run))
    try:
        for path in ("/v1/trace", "/v1/backward"):
            reply = call(server.url, "POST", path, {"prompt": PROMPT})
            assert reply.status == 200, (path, reply.text)
    finally:
        server.close()
