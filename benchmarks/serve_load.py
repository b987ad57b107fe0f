"""Load on `sheepop serve`: concurrent streaming clients over 127.0.0.1 against a serial loop.

    nice python benchmarks/serve_load.py                       # baby, 1/4/16/64 clients
    nice python benchmarks/serve_load.py --clients 1 16 --requests 32 --threads 1
    sheepop import SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol  # a real model (float32 weights)
    nice python benchmarks/serve_load.py --run /tmp/smol --clients 16 --requests 16 \
        --new-tokens 32 --serial-requests 4 --threads 1 --max-batch 16

A `baby`-preset run (random weights, a character vocabulary of printable ASCII: the arithmetic
of a trained model) is written to a temporary folder, unless `--run` names one. The serial loop
runs the same requests one after the other through sheepop's own generation loop in this
process (`sheepop.generation.generate`, its KV cache, the server's thread count), the fastest a
single sequence goes; it is measured again before each level, since on a shared machine the
load moves. `sheepop serve` runs as a subprocess on an ephemeral port, and for each number of
clients C, C threads each send streaming completions back to back (greedy, `--new-tokens`
tokens each, `ignore_eos`) until `--requests` (default max(8, 2 C)) have been sent. Per level
it prints the generated tokens/s over the level's wall time, time to first token and request
latency (p50, p99), failed requests, and the ratio to the serial loop's tokens/s and to the
server's own 1-client level (the same requests served one at a time); then the scheduler's
counters (plain decode steps, their mean time and rows; decode steps with prompt chunks in
their pass; prefill passes of their own), and the KV cache as it went:
GET /health sampled every 0.25 s during the level, the largest `kv_cache_bytes` seen at each
number of running sequences (it grows with the tokens in flight) and the server's peak.
The server and the serial loop run the same engine (`--engine`, default the server's `auto`
choice, whose start-up line is printed).

Bounded: every request has a timeout, each level stops sending after `--max-seconds`, and the
server is stopped at the end (SIGTERM), whatever happens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import machine
import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.config.build import build_config
from sheepop.config.schema import SampleConfig
from sheepop.generation.generate import generate
from sheepop.inference.load import load
from sheepop.scratch.init import init_params
from sheepop.tokenizers import train_tokenizer


def make_run(root: Path) -> Path:
    """The baby preset with random weights and a character vocabulary: printable ASCII."""
    tok = train_tokenizer("char", [string.printable])
    cfg = build_config("baby", None, [f"model.vocab_size={tok.vocab_size}", "model.dropout=0"])
    run = root / "baby"
    checkpoint.save_checkpoint(run, init_params(cfg.model, 0), cfg.to_dict(), tok.to_json())
    return run


def prompts(count: int) -> list[str]:
    """`count` different prompts of 16 to 79 characters, cut from this file's docstring."""
    text = " ".join(__doc__.split()) * 2
    return [text[(97 * i) % 1500:(97 * i) % 1500 + 16 + (37 * i) % 64] for i in range(count)]


def serial(model, texts: list[str], new: int) -> float:
    """Tokens/s of sheepop's own generation loop over these prompts, one after the other."""
    cfg = SampleConfig(temperature=0, max_new_tokens=new)
    t0, done = time.perf_counter(), 0
    for text in texts:
        done += sum(1 for _ in generate(model.lm, model.tokenizer.encode(text), cfg))
    return done / (time.perf_counter() - t0)


def post_stream(port: int, path: str, body: dict, on_text=None, timeout: float = 3600
                ) -> tuple[float, str, dict]:
    """A streamed request: (time to its first text, the text, its usage); `on_text(t)` at each
    event with text (t: perf_counter), which may return True to stop reading."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0, first, parts, usage = time.perf_counter(), None, [], {}
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True, "temperature": 0,
                                               "stream_options": {"include_usage": True}}),
                     {"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"status {reply.status}: {reply.read()[:200]!r}")
        for line in reply:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                usage = event["usage"]
            for c in event.get("choices", []):
                text = c.get("text") or (c.get("delta") or {}).get("content") or ""
                if text:
                    now = time.perf_counter()
                    first = now - t0 if first is None else first
                    parts.append(text)
                    if on_text is not None and on_text(now):
                        return first, "".join(parts), usage
    finally:
        conn.close()
    return first if first is not None else float("nan"), "".join(parts), usage


def stream(port: int, text: str, new: int, timeout: float) -> tuple[float, float, int]:
    """(time to first token, latency, tokens) of one streamed completion; raises on failure."""
    t0 = time.perf_counter()
    first, _, usage = post_stream(port, "/v1/completions", {
        "prompt": text, "max_tokens": new, "ignore_eos": True}, timeout=timeout)
    tokens = usage.get("completion_tokens", 0)
    if tokens != new:
        raise RuntimeError(f"{tokens} tokens, not {new}")
    return first, time.perf_counter() - t0, tokens


def level(port: int, clients: int, texts: list[str], new: int, max_s: float) -> dict:
    """C clients sending back to back until every text was sent (or `max_s` passed)."""
    todo = list(texts)
    lock = threading.Lock()
    results, failures = [], []
    stop_at = time.perf_counter() + max_s

    def client() -> None:
        while time.perf_counter() < stop_at:
            with lock:
                if not todo:
                    return
                text = todo.pop()
            try:
                results.append(stream(port, text, new, timeout=max_s))
            except Exception as e:  # counted, and reported
                failures.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = np.array([r[0] for r in results])
    lat = np.array([r[1] for r in results])
    return {"clients": clients, "requests": len(results) + len(failures) + len(todo),
            "failed": len(failures) + len(todo), "tok_s": sum(r[2] for r in results) / wall,
            "ttft": np.percentile(ttft, [50, 99]) if len(results) else [np.nan] * 2,
            "latency": np.percentile(lat, [50, 99]) if len(results) else [np.nan] * 2,
            "errors": sorted(set(failures))[:3]}


def health(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def sample_health(port: int, samples: list[dict], done: threading.Event,
                  every: float = 0.25) -> None:
    """GET /health every `every` seconds until `done`: the running rows and the KV cache's
    bytes as the level goes."""
    while not done.wait(every):
        try:
            samples.append(health(port))
        except OSError:
            pass


def kv_line(samples: list[dict], after: dict) -> str:
    """The KV cache as it followed the tokens in flight: its bytes against the running rows,
    the largest seen, and the server's peak."""
    if not samples:
        return "KV cache: no sample"
    by_rows: dict[int, int] = {}
    for s in samples:
        by_rows[s["running"]] = max(by_rows.get(s["running"], 0), s["kv_cache_bytes"])
    seen = ", ".join(f"{rows} running: {b / 2**20:.1f} MiB" for rows, b in sorted(by_rows.items()))
    return (f"KV cache (largest seen at each number of running sequences): {seen}; peak "
            f"{after['kv_cache_peak_bytes'] / 2**20:.1f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run directory to serve (default: a fresh baby run)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--requests", type=int, default=0, help="requests per level "
                    "(0: max(8, 2 x clients))")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) - 1),
                    help="torch threads, of the serial loop and of the server")
    ap.add_argument("--engine", default="auto", choices=["auto", "torch", "numpy"],
                    help="the engine of the server and of the serial loop (auto: the server's "
                         "choice, printed)")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=300, help="per level")
    ap.add_argument("--serial-requests", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run) if args.run else make_run(Path(tmp))
        texts = prompts(max([args.serial_requests, args.requests, *(2 * c for c in args.clients),
                             8]))
        from sheepop import threads as sheepop_threads
        sheepop_threads.apply(args.threads)
        print(machine.summary(), flush=True)
        model = load(run, args.engine)
        proc = subprocess.Popen(
            [sys.executable, "-m", "sheepop", "serve", str(run), "--port", "0", "--threads",
             str(args.threads), "--max-batch", str(args.max_batch), "--max-queue", "1024",
             "--engine", model.engine],
            stderr=subprocess.PIPE, text=True)
        try:
            line = ""
            while " at http://" not in line:
                line = proc.stderr.readline()
                if not line:
                    raise SystemExit("the server did not start")
            port = int(re.search(r":(\d+)\s*$", line).group(1))
            print(f"{run.name}: {model.engine} engine, {args.threads} thread(s), "
                  f"{args.new_tokens} new tokens per request, load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
            # Its stderr read on from here on, so that a full pipe never blocks the server.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            print("| clients | requests | failed | tok/s | TTFT p50 | TTFT p99 | latency p50 "
                  "| latency p99 | serial loop tok/s | x serial loop | x 1 client |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|")
            one = None
            for c in args.clients:
                # The serial loop just before each level: on a shared machine the load moves.
                base = serial(model, texts[:args.serial_requests], args.new_tokens)
                n = args.requests or max(8, 2 * c)
                before = health(port)
                samples: list[dict] = []
                watch = threading.Event()
                sampler = threading.Thread(target=sample_health, args=(port, samples, watch))
                sampler.start()
                try:
                    r = level(port, c, texts[:n], args.new_tokens, args.max_seconds)
                finally:
                    watch.set()
                    sampler.join()
                after = health(port)
                one = r["tok_s"] if c == 1 else one
                print(f"| {c} | {r['requests']} | {r['failed']} | {r['tok_s']:.1f} | "
                      f"{r['ttft'][0]:.3f} s | {r['ttft'][1]:.3f} s | {r['latency'][0]:.2f} s "
                      f"| {r['latency'][1]:.2f} s | {base:.1f} | {r['tok_s'] / base:.2f} | "
                      + (f"{r['tok_s'] / one:.2f} |" if one else "- |"), flush=True)
                steps = after["steps"] - before["steps"]
                mixed = after.get("mixed_steps", 0) - before.get("mixed_steps", 0)
                if steps:
                    rows = (after["tokens"] - before["tokens"]) / (steps + mixed)
                    step_ms = 1e3 * (after["decode_s"] - before["decode_s"]) / steps
                    pre = after["prefill_s"] - before["prefill_s"]
                    mixed_s = after.get("mixed_s", 0) - before.get("mixed_s", 0)
                    print(f"    server: {steps} decode steps, {step_ms:.1f} ms each, "
                          f"{rows:.1f} rows on average; {mixed} with prompt chunks in their "
                          f"pass, {mixed_s:.2f} s; prefills apart {pre:.2f} s; load average "
                          f"{os.getloadavg()[0]:.2f}"
                          + (f"; errors: {r['errors']}" if r["errors"] else ""), flush=True)
                    print("    " + kv_line(samples, after), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
