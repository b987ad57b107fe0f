"""The forward pass torch.compile sees (TorchLM.compile, `--compile`: dynamic shapes): a decode
step with the KV cache, rotary positions and grouped-query attention is one graph, with no break
that would start a frame per layer (each past dynamo's recompile limit of 8 then runs
eagerly)."""

from __future__ import annotations

import torch
from helpers.variants import gqa, llama
from torch._dynamo.utils import counters

from sheepop.config.schema import ModelConfig
from sheepop.model.gpt import GPT


def test_a_cached_decode_step_is_one_graph():
    cfg = ModelConfig(vocab_size=41, block_size=32, n_layer=2, n_embd=32, dropout=0.0,
                      **llama(**gqa(4, 2)))
    model = GPT(cfg).eval()
    graphs = []

    def backend(graph, example_inputs):  # dynamo's graphs, run as they are (no inductor)
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, dynamic=True, backend=backend)
    cache = model.new_cache(1)
    with torch.inference_mode():
        cache.make_room(3)
        compiled(torch.tensor([[1, 2, 3]]), cache=cache, last_only=True)  # the prefill's graph
        prefill_graphs = len(graphs)
        for token in (4, 5):
            cache.make_room(1)
            compiled(torch.tensor([[token]]), cache=cache, last_only=True)
    assert dict(counters["graph_break"]) == {}
    assert prefill_graphs == 1 and len(graphs) == 2  # one more for the decode steps
