"""Helpers of the server's tests: tiny runs, a tiny model in memory (the batching tests without
HTTP), a `sheepop serve` subprocess, an in-process server whose scheduler a test can hold, raw
HTTP, and sheepop's own generation as the reference."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from variants import ROPE

from sheepop.checkpoint import format as checkpoint
from sheepop.config.build import build_config
from sheepop.config.schema import Config, ModelConfig, SampleConfig
from sheepop.generation.text_stream import stream_text
from sheepop.inference.load import build
from sheepop.scratch.init import init_params, param_shapes
from sheepop.tokenizers import IncrementalDecoder, train_tokenizer
from sheepop.tokenizers.chat_format import END, with_chat_tokens

KEY = "sk-test-0123"
BOUND_S = 120  # the longest any wait here lasts (a start on a loaded machine takes ~6 s)
CONTEXT = 64


def weights(cfg: ModelConfig, seed: int = 7) -> dict[str, np.ndarray]:
    """Random weights, O(0.5): logits spread enough that greedy decoding has no near-ties."""
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=s) * (0.5 if len(s) > 1 else 0.2)
                + (1.0 if k.endswith("weight") and len(s) == 1 else 0.0)).astype(np.float32)
            for k, s in param_shapes(cfg).items()}


def make_runs(root: Path) -> tuple[Path, Path]:
    """(a run whose tokenizer has the chat template, a run without one), both tiny."""
    base = train_tokenizer("char", ["abcdefgh ijk.\n"])
    tok, _ = with_chat_tokens(base)
    out = []
    for name, t, positions in (("chat", tok, {"pos_encoding": "sinusoidal"}),
                               ("plain", base, ROPE)):
        cfg = Config()
        cfg.model = ModelConfig(vocab_size=t.vocab_size, block_size=CONTEXT, n_layer=2,
                                n_head=2, n_embd=32, tie_weights=False, **positions)
        checkpoint.save_checkpoint(root / name, weights(cfg.model), cfg.to_dict(), t.to_json())
        out.append(root / name)
    return out[0], out[1]


# ----- a tiny model in memory: the batching tests without HTTP ---------------------------------

def tiny_lm(engine: str, context: int, pos: str = "rope", digits: int = 0, **model: Any):
    """The `lm` of a 2-layer model of width 32 over 40 token ids (2 heads, context `context`,
    `pos` positions, `digits` digit places: a digits tokenizer, else char), in `engine`, with
    init_params' weights (seed 0) and every matrix tripled; `model`: other ModelConfig settings
    (variants.gqa()'s head counts)."""
    settings = {"vocab_size": 40, "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": context,
                "dropout": 0.0, "pos_encoding": pos, "digit_positions": digits, **model}
    cfg = build_config(None, None, [f"model.{k}={v}" for k, v in settings.items()]
                       + [f"data.tokenizer={'digits' if digits else 'char'}"])
    w = init_params(cfg.model, 0)
    w = {k: v * (3 if v.ndim > 1 else 1) for k, v in w.items()}  # spread logits: no near-ties
    return build(cfg, w, None, engine).lm


def random_tokens(seed: int, n: int) -> list[int]:
    """`n` token ids drawn from 1-39 (the tiny model's, 0 left out), fixed by `seed`."""
    return [int(t) for t in np.random.default_rng(seed).integers(1, 40, size=n)]


# ----- sheepop's own generation: what the server must give ---------------------------------------

def reference(model, ids: list[int], max_tokens: int, stop=(), chat: bool = False,
              seed: int = 0, temperature: float = 0.0) -> str:
    """The text `sheepop generate` writes after `ids` (a chat ends at <|end|>, or at another
    special token, as `sheepop chat`)."""
    tok = model.tokenizer
    end = tok.special_tokens[END] if chat else tok.eos_id
    stops = [t for t in tok.special_tokens if t != END] if chat else []
    cfg = SampleConfig(temperature=temperature, max_new_tokens=max_tokens, seed=seed)
    return "".join(stream_text(model.lm, ids, cfg, IncrementalDecoder(tok),
                               stop=[*stops, *stop], eos_id=end))


# ----- raw HTTP ----------------------------------------------------------------------------------

@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)

    def events(self) -> list[Any]:
        """The `data:` payloads of a server-sent-event stream ("[DONE]" kept as a string)."""
        out = []
        for block in self.text.split("\n\n"):
            if block.startswith("data: "):
                data = block[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
        return out


def call(url: str, method: str, path: str, body: Any = None, key: str | None = None,
         headers: dict[str, str] | None = None) -> Reply:
    """One request; `body` a dict (sent as JSON), bytes or str (sent as they are)."""
    host, port = re.match(r"http://([^:]+):(\d+)", url).groups()
    conn = http.client.HTTPConnection(host, int(port), timeout=BOUND_S)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    if isinstance(data, str):
        data = data.encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    if key:
        h["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()},
                     r.read().decode())
    finally:
        conn.close()


# ----- a server in a subprocess ------------------------------------------------------------------

def greedy_completion(server: ServerProcess, model: str, prompt: str, max_tokens: int,
                      **fields: Any) -> Any:
    """POST a greedy /v1/completions (and `fields`) to `server`; its JSON, checked to be 200."""
    reply = call(server.url, "POST", "/v1/completions",
                 {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                  **fields})
    assert reply.status == 200, reply.text
    return reply.json()


class ServerProcess:
    """`sheepop serve RUN --port 0 ARGS`; ready once it prints the address it listens on. A
    thread keeps reading its stderr (into `lines`), so the pipe never fills. As a context
    manager (`with ServerProcess(...) as s:`), stopped at the end and checked to exit 0."""

    def __init__(self, run: Path, *args: str, env: dict[str, str] | None = None,
                 preexec_fn=None):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sheepop", "serve", str(run), "--port", "0", "--threads",
             "1", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=preexec_fn)
        self.lines: list[str] = []
        ready: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line)
                if " at http://" in line:
                    ready.put(line)
            ready.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            line = ready.get(timeout=BOUND_S)
        except queue.Empty:
            line = None
        if line is None:
            self.proc.kill()
            raise RuntimeError("the server did not start: " + "".join(self.lines)[-3000:])
        self.url = re.search(r"at (http://\S+)", line).group(1)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum`; the exit status (killed after BOUND_S, as a failure)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        """Stopped by SIGTERM, which it must exit 0 on (a graceful shutdown)."""
        assert self.stop(signal.SIGTERM) == 0


# ----- a server in this process (its scheduler within reach) -------------------------------------

class InProcess:
    """`create_app` under uvicorn in a thread, on 127.0.0.1 at an ephemeral `port`: the tests
    that must hold the scheduler (a full queue, a timeout, a disconnection at a known step) or
    call the app with their own Host and Origin use it. `routes` are added after OpenAI's (the
    page's: sheepop.serve.page.routes.routes)."""

    def __init__(self, model, shutdown_timeout: float | None = None, routes: Sequence = (),
                 **settings: Any):
        import uvicorn

        from sheepop.serve.api.app import Settings, create_app
        from sheepop.serve.api.server import address_of, bind
        self.app = create_app(model, Settings(name="m", **settings), routes)
        self.scheduler = self.app.state.scheduler
        sock = bind("127.0.0.1", 0)
        self.url, self.port = address_of(sock), sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning",
                                                    lifespan="on",
                                                    timeout_graceful_shutdown=shutdown_timeout))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + BOUND_S
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def hold(self) -> threading.Event:
        """Hold the scheduler's thread (between two steps) until the returned event is set."""
        release, held = threading.Event(), threading.Event()

        def wait(model) -> None:
            held.set()
            release.wait(BOUND_S)

        self.scheduler.call(wait)
        held.wait(BOUND_S)
        return release

    def hold_after_step(self, steps: int) -> tuple[threading.Event, threading.Event]:
        """(held, release): the scheduler's thread stops once it has delivered the events of
        decode step `steps`, until `release` is set."""
        s, flush = self.scheduler, self.scheduler._flush
        held, release = threading.Event(), threading.Event()

        def flush_then_hold() -> None:
            flush()
            if s.stats["steps"] >= steps and not held.is_set():
                held.set()
                release.wait(BOUND_S)

        s._flush = flush_then_hold
        return held, release

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(BOUND_S)


def wait_until(condition, what: str) -> None:
    """Poll `condition` until it holds (an assertion error after BOUND_S)."""
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {BOUND_S} s"
        time.sleep(0.01)
