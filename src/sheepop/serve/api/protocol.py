"""OpenAI's request shapes, checked by hand: a request body becomes a `Request`, or an `ApiError`
that carries OpenAI's error JSON and its HTTP status (docs/serve.md, "Errors").

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}

Every field is checked for its type and range here, before anything reaches the model, so a bad
request costs nothing and changes nothing for the others. Fields this server does not know are
ignored (clients send many); fields it knows but does not implement are refused when they ask
for something (`presence_penalty: 0.5`), accepted when they ask for nothing (`presence_penalty:
0`).

The context: a prompt and its `max_tokens` must fit in the model's context (block_size tokens),
else 400 `context_length_exceeded`; nothing is ever cut. Without `max_tokens`, a choice may run to
the run's `sample.max_new_tokens` or to the end of the context, whichever comes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sheepop.config.schema import SampleConfig
from sheepop.errors import UserError
from sheepop.files import shown
from sheepop.generation.constraint import Constraint
from sheepop.generation.steering import Steering, SteeringVector, parse_strengths
from sheepop.serve.api.response_format import FormatError, response_constraint
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers.chat_format import can_chat, chat_ids, message_problem, turn_end

MAX_N = 8            # choices per prompt (OpenAI allows 128; a small CPU server needs fewer)
MAX_STOPS = 4        # stop strings, as OpenAI
MAX_LOGPROBS = 20    # alternatives per token (OpenAI: 5 for completions, 20 for chat)
MAX_SPECULATE = 64   # proposed tokens a step (sample.speculate's bound)
NO_TEMPLATE = ("this model has no chat template: serve a run made by `sheepop finetune`, or use "
               "/v1/completions")


@dataclass
class ApiError(Exception):
    """An error answered as OpenAI's JSON `{"error": {...}}` with this HTTP status."""
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(param: str | None, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class Served:
    """What a request is checked against: the model's name, tokenizer, context and defaults."""
    name: str
    tokenizer: Tokenizer
    context: int
    defaults: SampleConfig
    max_choices: int  # prompts x n of one request (it must fit in the queue)
    vectors: dict[str, SteeringVector] = field(default_factory=dict)  # --steer, by name


@dataclass
class Request:
    """A checked completion or chat request: `len(prompts) * n` choices to generate."""
    chat: bool
    prompts: list[list[int]]
    prompt_texts: list[str]
    max_tokens: list[int]          # one for each prompt
    n: int
    sample: SampleConfig           # temperature, top_p, top_k, min_p, repetition_penalty,
                                   # speculate
    seed: int | None
    stop: list[str]
    end_ids: frozenset[int]        # tokens that end a choice (not shown)
    logprobs: int | None           # None: off; k: the chosen token's and k alternatives
    echo: bool
    stream: bool
    include_usage: bool
    constraint: Constraint | None = None  # response_format or regex (each choice its state)
    steering: Steering | None = None  # {vector name: strength} (docs/steering.md)

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n


# ----- typed fields ------------------------------------------------------------------------------

def _int(body: dict, key: str, lo: int, hi: int | None, default: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        top = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise bad(key, f"'{key}' must be an integer {top}, not {shown(v)}")
    return v


def _number(body: dict, key: str, lo: float, hi: float, default: float,
            open_lo: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    # (an int is compared as it is: float() of a 400-digit one overflows)
    ok = (type(v) is int or (type(v) is float and math.isfinite(v))) \
        and (v > lo if open_lo else v >= lo)
    if not ok or v > hi:
        side = "(" if open_lo else "["
        raise bad(key, f"'{key}' must be a number in {side}{lo}, {hi}], not {shown(v)}")
    return float(v)


def _bool(body: dict, key: str) -> bool:
    v = body.get(key)
    if v is not None and type(v) is not bool:
        raise bad(key, f"'{key}' must be true or false, not {shown(v)}")
    return bool(v)


def _stops(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", f"'stop' must be a string or a list of strings, not {shown(v)}")
    if len(stops) > MAX_STOPS:
        raise bad("stop", f"'stop' holds {len(stops)} strings, at most {MAX_STOPS}")
    return [s for s in stops if s]


# Known fields this server does not implement, and the values that ask for nothing.
INERT = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},),
         "suffix": ("",), "best_of": (1,), "tools": ([],), "functions": ([],)}


def _refuse_unsupported(body: dict) -> None:
    for key, inert in INERT.items():
        v = body.get(key)
        if v is not None and not any(type(v) is type(i) and v == i for i in inert):
            raise bad(key, f"'{key}' is not supported by this server")


# ----- prompts -----------------------------------------------------------------------------------

def _completion_prompts(body: dict, tokenizer: Tokenizer) -> tuple[list[list[int]], list[str]]:
    """(ids, text) of each prompt: a string, strings, token ids, or lists of token ids."""
    p = body.get("prompt")
    if isinstance(p, str) or (isinstance(p, list) and p and type(p[0]) is int):
        p = [p]
    if not isinstance(p, list) or not p:
        raise bad("prompt", "'prompt' must be a string, a list of strings, a list of token ids "
                            f"or a list of such lists, not {shown(body.get('prompt'))}")
    read = [_completion_prompt(item, tokenizer) for item in p]
    return [ids for ids, _ in read], [text for _, text in read]


def _completion_prompt(item: Any, tokenizer: Tokenizer) -> tuple[list[int], str]:
    """(ids, text) of one prompt: a string, or a non-empty list of token ids."""
    if isinstance(item, str):
        return tokenizer.encode(item) or _start(tokenizer), item
    if not (isinstance(item, list) and item and all(type(i) is int for i in item)):
        raise bad("prompt", f"a prompt must be a string or a non-empty list of token ids, "
                            f"not {shown(item)}")
    bad_id = next((i for i in item if not 0 <= i < tokenizer.vocab_size), None)
    if bad_id is not None:
        raise bad("prompt", f"token id {bad_id} is outside the vocabulary "
                            f"(0..{tokenizer.vocab_size - 1})")
    return list(item), tokenizer.decode(item)


def _start(tokenizer: Tokenizer) -> list[int]:
    """The prompt of an empty string: BOS, else EOS (as `sheepop generate`)."""
    start = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if start is None:
        raise bad("prompt", "an empty prompt needs a tokenizer with a BOS or EOS token")
    return [start]


def _messages(body: dict) -> list[dict[str, str]]:
    """OpenAI's messages as the chat template's: text parts joined, 'developer' as 'system'."""
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise bad("messages", f"'messages' must be a list of messages, not {shown(raw)}")
    out = [_message(m) if isinstance(m, dict) else m for m in raw]  # (message_problem names
    problem = message_problem(out)  # a message that is no object)
    if problem is not None:
        raise bad("messages", f"not a conversation: {problem}")
    return out


def _message(m: dict) -> dict[str, Any]:
    """One message: its text parts joined, 'developer' read as 'system'."""
    content = m.get("content")
    if isinstance(content, list):
        if not all(isinstance(c, dict) and c.get("type") == "text"
                   and isinstance(c.get("text"), str) for c in content):
            raise bad("messages", "only text content parts are supported")
        content = "".join(c["text"] for c in content)
    role = "system" if m.get("role") == "developer" else m.get("role")
    return {"role": role, "content": content}


# ----- the whole request -------------------------------------------------------------------------

def parse(body: Any, served: Served, chat: bool) -> Request:
    """A checked `Request` from a decoded JSON body, or ApiError."""
    _for_this_server(body, served)
    prompts, texts, end, stops, top, max_tokens = (
        _chat_part if chat else _completion_part)(body, served.tokenizer)
    if _bool(body, "ignore_eos"):  # (an extension, as vLLM's: benchmarks run to max_tokens)
        end = frozenset()
    n = _int(body, "n", 1, MAX_N, 1)
    if len(prompts) * n > served.max_choices:
        raise bad("n", f"{len(prompts)} prompt(s) x n={n} choices is more than this server's "
                       f"queue holds ({served.max_choices})")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options", f"'stream_options' must be an object, not {shown(options)}")
    try:  # (sheepop.serve.api.response_format: 400 naming what cannot be enforced)
        constraint = response_constraint(body, served.tokenizer, end)
    except FormatError as e:
        raise bad(e.param, e.message) from None
    try:  # (an extension, as llama.cpp's control vectors: the server's --steer vectors)
        steering = parse_strengths(body.get("steering"), served.vectors, "steering")
    except ValueError as e:
        raise bad("steering", str(e)) from None
    return Request(
        chat=chat, prompts=prompts, prompt_texts=texts, n=n,
        max_tokens=[_fit(len(p), max_tokens, served, "messages" if chat else "prompt")
                    for p in prompts], sample=_sampling(body, served.defaults),
        seed=_int(body, "seed", 0, 2**63 - 1, None), stop=stops + _stops(body),
        end_ids=end, logprobs=top, echo=not chat and _bool(body, "echo"),
        stream=_bool(body, "stream"),
        include_usage=bool(options) and _bool(options, "include_usage"), constraint=constraint,
        steering=steering)


def _for_this_server(body: Any, served: Served) -> None:
    """A JSON object, naming this server's model (or none), asking nothing it does not do."""
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served.name:
        raise ApiError(404, f"the model {shown(model)} does not exist: this server serves "
                            f"'{served.name}'", param="model", code="model_not_found")
    _refuse_unsupported(body)


class _Part(NamedTuple):
    """What a chat and a completion read differently: the prompts, where a choice ends, the
    log-probabilities asked, the tokens asked."""
    prompts: list[list[int]]
    texts: list[str]
    end: frozenset[int]
    stops: list[str]
    top: int | None
    max_tokens: int | None


def _chat_part(body: dict, tok: Tokenizer) -> _Part:
    """A chat: one prompt, the conversation through the chat template with the assistant's
    turn opened; it ends at the turn's end (another turn's start is a stop string)."""
    if not can_chat(tok):
        raise bad("messages", NO_TEMPLATE, code="no_chat_template")
    try:  # the model's own template, or sheepop's (sheepop.tokenizers.chat_format)
        prompt = chat_ids(tok, _messages(body), add_generation_prompt=True)[0]
        turn = turn_end(tok)
    except UserError as e:  # e.g. a message holding a special token, a template's refusal
        raise bad("messages", str(e)) from None
    stops = [t for t in turn.stops if tok.special_tokens[t] not in turn.ids]  # (another turn)
    top = None
    if _bool(body, "logprobs"):
        top = _int(body, "top_logprobs", 0, MAX_LOGPROBS, 0)
    elif body.get("top_logprobs") is not None:
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    max_tokens = _int(body, "max_completion_tokens", 1, None, None)
    return _Part([prompt], [tok.decode(prompt)], turn.ids, stops, top,
                 _int(body, "max_tokens", 1, None, max_tokens))


def _completion_part(body: dict, tok: Tokenizer) -> _Part:
    """A completion: its prompts, ending at EOS."""
    prompts, texts = _completion_prompts(body, tok)
    end = frozenset() if tok.eos_id is None else frozenset({tok.eos_id})
    return _Part(prompts, texts, end, [], _int(body, "logprobs", 0, MAX_LOGPROBS, None),
                 _int(body, "max_tokens", 1, None, None))


def _sampling(body: dict, d: SampleConfig) -> SampleConfig:
    """The sampling asked, each field within its bounds, the server's defaults for the rest."""
    return SampleConfig(
        temperature=_number(body, "temperature", 0, 2, d.temperature),
        top_p=_number(body, "top_p", 0, 1, d.top_p, open_lo=True),
        top_k=_int(body, "top_k", 0, None, d.top_k),
        min_p=_number(body, "min_p", 0, 1, d.min_p),  # (llama.cpp's and vLLM's field)
        repetition_penalty=_number(body, "repetition_penalty", 0, 10, d.repetition_penalty,
                                   open_lo=True),
        # (sheepop's extension: proposals checked a step while the choice runs alone; 0 off)
        speculate=_int(body, "speculate", 0, MAX_SPECULATE, d.speculate))


def _fit(prompt: int, max_tokens: int | None, served: Served, what: str) -> int:
    """The tokens a choice may generate after a prompt of `prompt` tokens: `max_tokens`, which
    must fit in the context, or the default, cut to what fits."""
    room = served.context - prompt
    asked = max_tokens if max_tokens is not None else 1
    if prompt + asked > served.context:
        raise bad(what if max_tokens is None else "max_tokens",
                  f"This model's maximum context length is {served.context} tokens. However, "
                  f"you requested {prompt + asked} tokens ({prompt} in the prompt, {asked} in "
                  f"the completion). Please reduce the length of the prompt or completion.",
                  code="context_length_exceeded")
    return max_tokens if max_tokens is not None else min(served.defaults.max_new_tokens, room)
