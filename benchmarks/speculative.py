"""Speculative decoding by prompt lookup on SmolLM2-135M-Instruct, batch 1: tokens/s with and
without on copy-heavy tasks (issue 45's target: >= 1.5x).

    python benchmarks/speculative.py                          # imports SmolLM2; the full run
    python benchmarks/speculative.py --run /tmp/smol --repeats 1 --new-tokens 64   # a check

Tasks (--tasks): `edit`, a code edit of a given function (the answer copies most of it), and
`quote`, a summary that quotes its text. Each is asked through the chat template and answered
greedily (--temperature 0: the two answers must be the same tokens, checked) or sampled, up to
--new-tokens or the turn's end. For each task and repetition the plain run (sample.speculate 0)
and the speculative one (--speculate k) alternate, the order swapped every repetition; printed
per run: tokens, seconds, tokens/s, the checking passes and the proposed tokens accepted, and the
load average; then per task the median tokens/s each way and their ratio.

--server measures the same through `sheepop serve` (issue 45: the server speculates while a
request runs alone): one server started with --speculate k, one client at a time (batch 1),
each task's chat request streamed through /v1/chat/completions with `speculate` k and 0
alternating (the order swapped every repetition), after one warm-up request that puts the
prompt in the prefix cache (so each measured request computes its answer, not its prompt).
Printed per request: tokens, the time to first token, the tokens/s after the first (the decode
part), the proposed tokens accepted (usage's completion_tokens_details) and the load; then per
task the medians and their ratio, and whether the greedy answers were the same text.

    python benchmarks/speculative.py --server --repeats 5 --new-tokens 256

--pass-cost measures what the gate's cost model (sheepop.generation.speculative.PASS_COST)
is made of: after the edit task's prompt, a checking pass over m positions against a decode
step, alternating, each rolled back (median of --repeats x 10 of each), for m = 2, 3, 5, 9,
17, 33; printed as decode steps per pass.

    python benchmarks/speculative.py --pass-cost --repeats 3

--replay judges the gate alone, without the clock's noise: each task's plain greedy answer is
generated once, then replayed through `check_pass` with a stand-in for the model that gives
each position the answer's own token (so every proposal is kept or turned down exactly as the
model would) and counts a decode step as 1 and a pass over m positions as PASS_COST's c(m).
Printed per task: the proposals kept, the checks, and tokens per modelled step (plain: 1.00x).

    python benchmarks/speculative.py --replay
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "serve"))

import machine  # noqa: E402
from structured_output import smollm2_run  # noqa: E402

from sheepop.config.schema import SampleConfig  # noqa: E402
from sheepop.generation.generate import generate  # noqa: E402

FUNCTION = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            averages.append(total / window)
    return averages
'''

TEXT = ("The river rose for three days after the storm. On the fourth morning the mayor "
        "said: \"We will open the old spillway at noon, and every family below the mill must "
        "leave their homes by ten.\" The engineers warned that the spillway had not been "
        "opened in forty years. \"If the gates stick, the water will take the bridge first "
        "and the school second,\" said the chief engineer, Maria Okafor. The gates opened at "
        "twelve minutes past noon, and by evening the river had fallen by a metre.")

TASKS = {
    "edit": "Rename the variable `total` to `running_sum` in this function and write the whole "
            "function again:\n\n" + FUNCTION,
    # (asked to summarise "in three sentences, quoting what the mayor and the chief engineer
    # said", SmolLM2-135M paraphrased both: 5 of 80 proposed tokens kept)
    "quote": "Write a short summary of this story for a newspaper, quoting the mayor word for "
             "word:\n\n" + TEXT,
}


class Counted:
    """The model, counting its checking passes, the tokens they were given, and its decode
    steps (the passes without a proposal)."""

    def __init__(self, lm):
        self.lm, self.passes, self.checked, self.decodes = lm, 0, 0, 0

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def verify(self, ids):
        self.passes += 1
        self.checked += len(ids)
        return self.lm.verify(ids)

    def decode(self, token):
        self.decodes += 1
        return self.lm.decode(token)


def run_once(lm, prompt: list[int], cfg: SampleConfig, end: int) -> dict:
    counted = Counted(lm)
    t = time.perf_counter()
    tokens = [s.token for s in generate(counted, prompt, cfg, eos_id=end)]
    seconds = time.perf_counter() - t
    # each forward pass after the prompt's gives one token beyond the proposals it accepts (the
    # first token comes from the prompt's); a checking pass is given the newest token too
    proposed = counted.checked - counted.passes
    accepted = len(tokens) - 1 - counted.passes - counted.decodes
    return {"tokens": tokens, "seconds": seconds, "rate": len(tokens) / seconds,
            "passes": counted.passes, "decodes": counted.decodes, "proposed": proposed,
            "accepted": accepted,
            "load": os.getloadavg()[0]}


def stream_once(url: str, body: dict) -> dict:
    """One streamed request: its text, tokens, time to first token, decode rate, usage."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(
        {**body, "stream": True, "stream_options": {"include_usage": True}}),
        headers={"Content-Type": "application/json"})
    response, text, times, usage = conn.getresponse(), [], [], None
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[len(b"data: "):])
        if chunk.get("error"):
            sys.exit(f"the server answered an error: {chunk['error']['message']}")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            if choice["delta"].get("content"):
                text.append(choice["delta"]["content"])
                times.append(time.perf_counter())
    conn.close()
    n = usage["completion_tokens"]
    first, last = (times[0], times[-1]) if times else (t0, t0)
    details = usage["completion_tokens_details"]
    return {"text": "".join(text), "tokens": n, "ttft": first - t0,
            "rate": (n - 1) / (last - first) if n > 1 and last > first else float("nan"),
            "accepted": details["accepted_prediction_tokens"],
            "proposed": details["accepted_prediction_tokens"] +
            details["rejected_prediction_tokens"], "load": os.getloadavg()[0]}


def serve_runs(args: argparse.Namespace, run: Path) -> None:
    """--server: the tasks through `sheepop serve` at batch 1, speculate k and 0 alternating."""
    from serve_helpers import ServerProcess
    threads = str(args.threads or 1)
    server = ServerProcess(run, "--engine", args.engine, "--speculate", str(args.speculate),
                           "--threads", threads, "--max-batch", "1",
                           env={"OMP_NUM_THREADS": threads})
    try:
        for task in args.tasks:
            body = {"messages": [{"role": "user", "content": TASKS[task]}],
                    "max_tokens": args.new_tokens, "temperature": args.temperature,
                    "top_k": 0, "top_p": 1.0, "min_p": 0.0}
            stream_once(server.url, {**body, "max_tokens": 1, "seed": 0})  # prompt cached
            rates: dict[str, list[float]] = {"plain": [], "speculative": []}
            texts: dict[str, set[str]] = {"plain": set(), "speculative": set()}
            print(f"\n{task}: through the server, {args.engine} engine, speculate "
                  f"{args.speculate}, temperature {args.temperature}, batch 1")
            for r in range(args.repeats):
                order = [("plain", 0), ("speculative", args.speculate)]
                for name, k in order if r % 2 == 0 else order[::-1]:
                    m = stream_once(server.url, {**body, "seed": r, "speculate": k})
                    rates[name].append(m["rate"])
                    texts[name].add(m["text"])
                    share = f"{m['accepted']}/{m['proposed']}" if m["proposed"] else "-"
                    print(f"  {r} {name:11s} {m['tokens']:4d} tokens  first {m['ttft']:6.2f} s "
                          f"then {m['rate']:6.2f} tok/s  accepted {share:9s} "
                          f"load {m['load']:.2f}", flush=True)
            p, s = (statistics.median(rates[k]) for k in ("plain", "speculative"))
            same = f"; greedy answers the same text: {texts['plain'] == texts['speculative']}" \
                if args.temperature == 0 else ""
            print(f"{task}: median {p:.2f} tok/s plain, {s:.2f} speculative after the first "
                  f"token: {s / p:.2f}x ({args.repeats} repetitions, alternating){same}")
    finally:
        server.stop()
        print("".join(line for line in server.lines if "speculative decoding" in line)[-2000:])


def pass_costs(lm, prompt: list[int], repeats: int) -> None:
    """--pass-cost: a pass over m positions in decode steps (the module's docstring)."""
    lm.prefill(prompt[:-1])
    sizes = [2, 3, 5, 9, 17, 33]
    times: dict[int, list[float]] = {m: [] for m in [1] + sizes}
    for _ in range(10 * repeats):
        for m in [1] + sizes:
            t = time.perf_counter()
            if m == 1:
                lm.decode(prompt[-1])
            else:
                lm.verify(prompt[-m:])
            times[m].append(time.perf_counter() - t)
            lm.rollback(m)
    step = float(np.median(times[1]))
    print(f"decode step {step * 1e3:.2f} ms (median of {len(times[1])}); a pass over m "
          f"positions, in decode steps: " +
          ", ".join(f"{m}: {np.median(times[m]) / step:.2f}" for m in sizes) +
          f"  load {os.getloadavg()[0]:.2f}")


class Replayed:
    """The model's stand-in for --replay: no logits, only the modelled cost of each pass."""

    def __init__(self):
        self.cost = 0.0

    def verify(self, ids):
        from sheepop.generation.speculative import pass_cost
        self.cost += pass_cost(len(ids))
        return [None] * len(ids)

    def decode(self, token):
        self.cost += 1.0
        return np.zeros(1)

    def rollback(self, n):
        pass


def replay(prompt: list[int], answer: list[int], k: int) -> str:
    """--replay: the answer's tokens through check_pass with a fresh Gate (the docstring)."""
    from sheepop.generation.speculative import Gate, check_pass
    lm, gate, ids = Replayed(), Gate(), list(prompt) + answer[:1]

    def take(z, proposed):
        token = answer[len(ids) - len(prompt)]
        ids.append(token)
        return token, len(ids) - len(prompt) == len(answer)
    while len(ids) - len(prompt) < len(answer):
        check_pass(lm, ids, min(k, len(prompt) + len(answer) - len(ids) - 1), gate, take)
    return (f"{gate.accepted} of {gate.proposed} proposed tokens kept in {gate.passes} checks; "
            f"{(len(answer) - 1) / lm.cost:.2f}x the tokens per modelled step of plain decoding")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="an imported SmolLM2 run (default: import it)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--speculate", type=int, default=16, help="proposed tokens a pass")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--engine", default="torch", choices=["numpy", "torch"])
    ap.add_argument("--threads", type=int, default=0, help="0: the idle cores (sheepop.threads)")
    ap.add_argument("--server", action="store_true",
                    help="through `sheepop serve` at batch 1 (the module's docstring)")
    ap.add_argument("--pass-cost", action="store_true",
                    help="a checking pass's cost in decode steps (the module's docstring)")
    ap.add_argument("--replay", action="store_true",
                    help="the gate on each task's greedy answer, modelled time (the docstring)")
    args = ap.parse_args()
    from sheepop import threads
    print(f"threads: {threads.apply(args.threads)}")
    print(machine.summary())
    if args.server:
        serve_runs(args, smollm2_run(args.run))
        print(machine.summary())
        return
    from sheepop.inference.load import load
    from sheepop.tokenizers.chat_format import chat_ids, turn_end
    model = load(smollm2_run(args.run), engine=args.engine)
    tok = model.tokenizer
    (end,) = turn_end(tok).ids
    plain = SampleConfig(max_new_tokens=args.new_tokens, temperature=args.temperature,
                         top_k=0, top_p=1.0, min_p=0.0, seed=0, speculate=0)
    spec = dataclasses.replace(plain, speculate=args.speculate)
    if args.pass_cost:
        pass_costs(model.lm, chat_ids(tok, [{"role": "user", "content": TASKS["edit"]}],
                                      True)[0], args.repeats)
        print(machine.summary())
        return
    for task in args.tasks:
        prompt = chat_ids(tok, [{"role": "user", "content": TASKS[task]}], True)[0]
        if args.replay:
            answer = [s.token for s in generate(model.lm, prompt, plain, eos_id=end)]
            print(f"{task}: {len(answer)} tokens replayed, speculate {args.speculate}: "
                  f"{replay(prompt, answer, args.speculate)}", flush=True)
            continue
        rates: dict[str, list[float]] = {"plain": [], "speculative": []}
        print(f"\n{task}: a prompt of {len(prompt)} tokens, {args.engine} engine, "
              f"speculate {args.speculate}, temperature {args.temperature}")
        for r in range(args.repeats):
            order = [("plain", plain), ("speculative", spec)]
            outputs = {}
            for name, cfg in order if r % 2 == 0 else order[::-1]:
                cfg = dataclasses.replace(cfg, seed=r)
                m = run_once(model.lm, prompt, cfg, end)
                rates[name].append(m["rate"])
                outputs[name] = m["tokens"]
                share = f"{m['accepted']}/{m['proposed']}" if m["proposed"] else "-"
                print(f"  {r} {name:11s} {len(m['tokens']):4d} tokens {m['seconds']:7.2f} s "
                      f"{m['rate']:6.2f} tok/s  checks {m['passes']:4d} decodes {m['decodes']:4d}  "
                      f"accepted {share:9s} "
                      f"load {m['load']:.2f}", flush=True)
            if args.temperature == 0:
                same = outputs["plain"] == outputs["speculative"]
                print(f"    greedy answers the same tokens: {same}")
                if r == 0:
                    print("    " + repr(tok.decode(outputs["plain"][:-1]))[:300])
        p, s = (statistics.median(rates[k]) for k in ("plain", "speculative"))
        print(f"{task}: median {p:.2f} tok/s plain, {s:.2f} speculative: {s / p:.2f}x "
              f"({args.repeats} repetitions, alternating)")
    print(machine.summary())


if __name__ == "__main__":
    main()
