"""`sheepop serve RUN_DIR`: an OpenAI-compatible HTTP server with continuous batching
(sheepop.serve, docs/serve.md)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from sheepop.cli.common import (
    HelpFormatter,
    add_best_option,
    add_compile_option,
    add_dtype_option,
    add_sampling_flags,
    add_speculate_flag,
    add_threads_option,
    flag_values,
    model_dir,
    run_config,
)
from sheepop.cli.steer import served_vectors
from sheepop.config.model_size import param_count
from sheepop.config.schema import INFERENCE_ENGINES
from sheepop.errors import UserError

API_KEY_ENV = "SHEEPOP_API_KEY"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a trained model over HTTP with OpenAI's API: POST /v1/completions "
                    "and /v1/chat/completions (whole or streamed), GET /v1/models and "
                    "/health. Requests are batched continuously: each decode step advances "
                    "every running request by one token, and requests join and leave the batch "
                    "at any step. One line on stderr says when it is ready and where; SIGINT "
                    "or SIGTERM stops it gracefully (exit status 0). Sampling defaults are the "
                    "run's [sample] section, then the sampling flags below; each request's "
                    "parameters override them (a request without a seed draws a fresh one). "
                    "The page "
                    "at / shows the model at work (generation with probabilities, attention, "
                    "logit lens: POST /v1/inspect) and the training curves of --runs. See "
                    "docs/serve.md and docs/page.md.",
        formatter_class=HelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by `sheepop train` "
                   "or `sheepop finetune` (a chat template enables /v1/chat/completions)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (0.0.0.0: every interface; give an API key)")
    p.add_argument("--port", type=int, default=8000,
                   help="the TCP port (0: any free port; the ready line names it)")
    p.add_argument("--engine", choices=INFERENCE_ENGINES, default="auto",
                   help="the engine that runs the model; auto: the one measured faster for "
                        "the model's size, dtype and threads (printed at start-up; "
                        "docs/performance.md)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    add_dtype_option(p)
    add_compile_option(p)
    add_sampling_flags(p, seed_note=None)
    add_speculate_flag(p, server=True)
    p.add_argument("--steer", action="append", default=[], metavar="FILE",
                   help="a steering vector (`sheepop steer make`) that a request may name in "
                        "its \"steering\" field, {NAME: strength}, NAME being the file's name "
                        "without its extension (repeatable); see docs/steering.md")
    p.add_argument("--max-batch", type=int, default=16,
                   help="the most sequences decoding together (one KV cache row each)")
    p.add_argument("--cache-mb", type=float, default=1024, metavar="MIB",
                   help="memory for prompt reuse: the keys and values of earlier requests, kept "
                        "in blocks of 16 tokens and copied into any later prompt that starts "
                        "with the same tokens (least recently used evicted first; 0: off; "
                        "GET /health shows what it holds)")
    p.add_argument("--prefill-chunk", type=int, default=0, metavar="TOKENS",
                   help="the prompt tokens computed per decode step while sequences run: a "
                        "long prompt joins a chunk at a time, in the decode step's forward "
                        "pass, so running streams wait for one chunk per token, not for its "
                        "whole prompt (0: sized by cost, see --prefill-budget)")
    p.add_argument("--prefill-budget", type=float, default=1.5, metavar="RATIO",
                   help="with --prefill-chunk 0, a decode step that also computes prompt "
                        "tokens takes about RATIO times a plain step's time (both measured as "
                        "the server runs): the running streams' time between tokens while a "
                        "prompt joins, against their steady one (their p99 a little more)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="the most sequences waiting for a row; past it a request gets 503 with "
                        "Retry-After")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="a request's longest time from arrival to its last token (then 504, or "
                        "an error event in a stream)")
    p.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                   help="the largest request body (larger: 413)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every request but /health "
                        f"(default: the {API_KEY_ENV} environment variable, which keeps the key "
                        f"out of the process list; unset: no key; empty: an error)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page of another origin that may call the API from a browser "
                        "(CORS), e.g. http://localhost:3000; repeat for more. Without it, "
                        "requests from other sites' pages, and requests naming another Host "
                        "than localhost or the address bound, get 403")
    p.add_argument("--model-name", default=None, metavar="NAME",
                   help="the model's id in the API (default: the run directory's name)")
    add_best_option(p)
    add_threads_option(p, spare=1)
    p.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="on SIGINT/SIGTERM, how long running requests may go on before they "
                        "are cancelled")
    p.add_argument("--timeout-idle", type=float, default=10.0, metavar="SECONDS",
                   help="a connection that sends nothing for this long while a request is "
                        "awaited (a new one, or kept alive between requests) is closed")
    p.add_argument("--timeout-read", type=float, default=30.0, metavar="SECONDS",
                   help="a request's head and body must arrive within this of its first byte "
                        "(then 408 and the connection is closed)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="the most open connections; past it a new one gets 503 with "
                        "Retry-After at once (default: what the open-file limit leaves room "
                        "for, at most 1024)")
    p.add_argument("--access-log", action="store_true", help="log every request on stderr")
    p.add_argument("--runs", default=None, metavar="DIR",
                   help="the page's runs view also lists every run under DIR (its "
                        "metrics.jsonl curves, updated while it trains)")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    from sheepop.inference.load import engine_refusal
    refusal = engine_refusal(args.engine, args.compile)
    checks = [(0 <= args.port <= 65535, "--port must be in 0..65535"),
              (args.max_batch >= 1, "--max-batch must be at least 1"),
              (args.max_queue >= 1, "--max-queue must be at least 1"),
              (args.cache_mb >= 0, "--cache-mb must be >= 0"),
              (args.prefill_chunk >= 0, "--prefill-chunk must be >= 0"),
              (args.prefill_budget > 1, "--prefill-budget must be more than 1 (a step's time "
                                        "and some prompt)"),
              (args.timeout > 0, "--timeout must be a positive number of seconds"),
              (args.max_body >= 1024, "--max-body must be at least 1024 bytes"),
              (args.shutdown_timeout >= 0, "--shutdown-timeout must be >= 0"),
              (args.timeout_idle > 0, "--timeout-idle must be a positive number of seconds"),
              (args.timeout_read > 0, "--timeout-read must be a positive number of seconds"),
              (args.max_connections is None or args.max_connections >= 1,
               "--max-connections must be at least 1"),
              (refusal is None, refusal),
              (args.runs is None or Path(args.runs).is_dir(),
               f"--runs {args.runs}: not a directory")]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    if args.api_key == "" or (args.api_key is None and os.environ.get(API_KEY_ENV) == ""):
        where = "--api-key" if args.api_key == "" else API_KEY_ENV
        raise UserError(f"{where} is empty: give a key, or leave it out for no key")
    from sheepop.serve.api.origin import origin_problem
    for origin in args.allow_origin:
        problem = origin_problem(origin)
        if problem is not None:
            raise UserError(problem)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args: argparse.Namespace) -> int:
    from sheepop.inference.load import load
    from sheepop.serve.api.app import Settings, create_app
    from sheepop.serve.api.connections import limits
    from sheepop.serve.api.server import address_of, bind
    from sheepop.serve.api.server import run as serve
    from sheepop.serve.page.routes import routes as page_routes
    _check(args)
    sample = run_config(model_dir(args), [], None, flag_values(args), only=("sample",)
                        ).validate().sample  # (a bad flag is refused before the port is bound)
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    sock = bind(args.host, args.port)  # (a busy port fails before the model is loaded)
    try:
        model = load(model_dir(args), args.engine, args.device, args.dtype, args.compile)
        model.config.sample = sample  # the requests' defaults
        name = args.model_name or Path(args.run_dir).resolve().name
        vectors = served_vectors(args.steer, model, args.run_dir)
        app = create_app(model, Settings(name=name, api_key=key, max_batch=args.max_batch,
                                         max_queue=args.max_queue, timeout=args.timeout,
                                         cache_mb=args.cache_mb,
                                         prefill_chunk=args.prefill_chunk,
                                         prefill_budget=args.prefill_budget,
                                         max_body=args.max_body, host=args.host,
                                         allow_origins=tuple(args.allow_origin),
                                         vectors=vectors),
                         page_routes(args.run_dir, args.runs))
        bounds = limits(args.timeout_idle, args.timeout_read, args.max_connections)
    except BaseException:
        sock.close()
        raise
    if not key and not _loopback(args.host):
        print(f"sheepop: warning: listening on {args.host} without an API key: anyone who "
              f"reaches this machine can use the model (--api-key or {API_KEY_ENV})",
              file=sys.stderr)
    m = model.config.model

    def ready() -> None:
        print(f"sheepop: serving '{name}' ({param_count(m):,} parameters, context "
              f"{m.block_size}, {model.engine} engine, batches of up to {args.max_batch}) at "
              f"{address_of(sock)}", file=sys.stderr, flush=True)

    serve(app, sock, args.shutdown_timeout, ready, access_log=args.access_log,
          limits=bounds)
    print("sheepop: server stopped", file=sys.stderr)
    return 0
