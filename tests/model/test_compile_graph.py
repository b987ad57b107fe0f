"""The forward pass torch.compile sees: a decode step with the KV cache, rotary positions and
grouped-query attention is one graph, with no break that would start a frame per layer (each
past dynamo's recompile limit of 8 then runs eagerly); and the compiled decode step of
TorchLM.compile (`--compile`, tests/model/test_compiled_decode.py) is not compiled again as
the cache grows."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters
from variants import gqa, llama

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


def test_compiled_decoding_is_not_compiled_again_as_the_cache_grows():
    """TorchLM grows the cache one column ahead of a compiled step: a step whose keys fill the
    buffer exactly made torch.compile compile again at each growth (at 64 columns, then 128,
    ...: on the GPU, SmolLM2 passed dynamo's recompile limit and ran eagerly from then on)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from sheepop.model.lm import TorchLM

    cfg = ModelConfig(vocab_size=41, block_size=200, n_layer=1, n_embd=32, dropout=0.0,
                      **llama(**gqa(4, 2)))
    lm = TorchLM(GPT(cfg))
    graphs = []
    aot = aot_autograd(fw_compiler=lambda gm, example: make_boxed_func(gm.forward))

    def backend(graph, example_inputs):  # dynamo's graphs, through aot autograd's tracing
        graphs.append(graph)             # (where the full slice is told apart), no inductor
        return aot(graph, example_inputs)

    torch._dynamo.reset()
    lm.compile(backend=backend)
    token = int(lm.prefill([1, 2, 3]).argmax())
    token = int(lm.decode(token).argmax())
    after_first_step, capacities = len(graphs), set()
    for _ in range(70):  # past 64 columns
        token = int(lm.decode(token).argmax())
        capacities.add(lm.cache.capacity)
    assert capacities == {64, 128}, capacities
    assert len(graphs) == after_first_step
