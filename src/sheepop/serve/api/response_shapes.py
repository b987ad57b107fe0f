"""OpenAI's response shapes: a whole response, or the chunks of a stream, from the scheduler's
events (sheepop.serve.api.choice.Event).

    /v1/completions       {"object": "text_completion", "choices": [{"text", "index",
                           "logprobs", "finish_reason"}], "usage": {...}}
    /v1/chat/completions  {"object": "chat.completion", "choices": [{"index", "message":
                           {"role": "assistant", "content"}, "logprobs", "finish_reason"}], ...}
    streams               the same with "object" "text_completion" / "chat.completion.chunk",
                          one choice per chunk (chat: a "delta" in place of "message")

Log-probabilities: completions use the legacy shape (tokens, token_logprobs, top_logprobs as
{token: logprob}, text_offset), chats the newer one (content: [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}]). A token that is not whole UTF-8 on its own (a piece
of a multi-byte character) is written "bytes:\\xe2\\x80" as OpenAI does; `bytes` always holds its
bytes.
A generated token's entry also carries sheepop's `sampled` (null for an echoed prompt token):
{"id": its token id, "logprob": log q, "top_logprobs": [{"token", "id", "logprob": log q,
"model_logprob": log p}]}, q the distribution it was drawn from (sheepop.serve.api.choice);
completions list them in `logprobs.sampled`, one per token.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from sheepop.serve.api.choice import Event, Logprob
from sheepop.serve.api.protocol import Request
from sheepop.tokenizers import Tokenizer


class TokenTexts:
    """Each token's text and UTF-8 bytes on its own (computed once per id)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, i: int) -> tuple[str, list[int]]:
        if i not in self.cache:
            text = self.tokenizer.decode([i], errors="surrogateescape")
            data = text.encode("utf-8", "surrogateescape")
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in data)
            self.cache[i] = (text, list(data))
        return self.cache[i]


class Render:
    """The JSON of one request's response (or stream)."""

    def __init__(self, request: Request, texts: TokenTexts, model: str):
        self.r, self.texts, self.model = request, texts, model
        self.chat = request.chat
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if self.chat else "text_completion"
        self.generated = [0] * request.choices   # tokens per choice (usage)
        self.offset = [0] * request.choices      # text written per choice (text_offset)
        self.cached_tokens = 0  # of the prompts' tokens, those the prefix cache held (usage)
        self.prefill_chunks = 0  # the chunks the rest was computed in (sheepop's extension)
        self.proposed = self.accepted = 0  # speculative decoding's proposals, those kept

    # ----- pieces ------------------------------------------------------------------------------
    def usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.r.prompts)
        done = sum(self.generated)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                # (OpenAI's names for predicted tokens kept and not: here, the proposals)
                "completion_tokens_details": {
                    "accepted_prediction_tokens": self.accepted,
                    "rejected_prediction_tokens": self.proposed - self.accepted},
                "prefill_chunks": self.prefill_chunks}

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion.chunk" if chunk and self.chat else self.object
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def logprobs(self, index: int, entries: list[Logprob]) -> dict[str, Any] | None:
        """The logprobs object of these tokens of choice `index` (None: none asked)."""
        if self.r.logprobs is None:
            return None
        if self.chat:
            return {"content": [self._chat_entry(e) for e in entries],
                    "refusal": None}
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                "text_offset": [], "sampled": []}
        for e in entries:
            token = self.texts(e.token)[0]
            out["tokens"].append(token)
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append(
                None if e.logprob is None else {self.texts(i)[0]: lp for i, lp in e.top})
            out["text_offset"].append(self.offset[index])
            out["sampled"].append(self._sampled(e))
            self.offset[index] += len(token)
        return out

    def _chat_entry(self, e: Logprob) -> dict[str, Any]:
        def one(i: int, lp: float) -> dict[str, Any]:
            text, data = self.texts(i)
            return {"token": text, "logprob": lp, "bytes": data}
        return {**one(e.token, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top],
                "sampled": self._sampled(e)}

    def _sampled(self, e: Logprob) -> dict[str, Any] | None:
        """sheepop's extension: what the token was drawn from (see the module's docstring)."""
        q = e.sampled
        if q is None:
            return None
        return {"id": e.token, "logprob": q.logprob, "top_logprobs": [
            {"token": self.texts(i)[0], "id": i, "logprob": lq, "model_logprob": lp}
            for i, lq, lp in q.top]}

    def _prompt_entries(self, prompt_index: int, event: Event) -> list[Logprob]:
        """Echo with logprobs: the prompt's tokens come first (the first has no logprob)."""
        if event.prompt_logprobs is None:
            return []
        first = self.r.prompts[prompt_index][0]
        return [Logprob(first, None, []) if e is None else e for e in event.prompt_logprobs]

    # ----- a stream ----------------------------------------------------------------------------
    def opening(self) -> list[dict[str, Any]]:
        """The chunks before any token: the assistant's role, in a chat."""
        if not self.chat:
            return []
        return [self._chunk(i, {"role": "assistant", "content": ""}, None, None)
                for i in range(self.r.choices)]

    def chunk(self, event: Event) -> dict[str, Any] | None:
        """The chunk of one event (None: nothing to say yet, e.g. text held back)."""
        i = event.index
        text, entries = self._said(event)
        if event.token is not None:
            self.generated[i] += 1
        if not text and not entries and event.finish is None:
            return None
        lp = self.logprobs(i, entries) if entries else None
        if self.chat:
            return self._chunk(i, {"content": text} if text or entries else {}, lp,
                               event.finish)
        return self._chunk(i, text, lp, event.finish)

    def _said(self, event: Event) -> tuple[str, list[Logprob]]:
        """The text and log-probabilities an event adds: with echo, the choice's first event
        brings its prompt first."""
        i = event.index
        text, entries = event.text, [event.logprob] if event.logprob is not None else []
        if self.r.echo and self.generated[i] == 0:
            text = self.r.prompt_texts[i // self.r.n] + text
            entries = self._prompt_entries(i // self.r.n, event) + entries
        return text, entries

    def _chunk(self, index: int, content: Any, lp: Any, finish: str | None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": index, "delta": content, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"text": content, "index": index, "logprobs": lp, "finish_reason": finish}
        body = {**self._head(chunk=True), "choices": [choice]}
        if self.r.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._head(chunk=True), "choices": [], "usage": self.usage()}

    # ----- a whole response --------------------------------------------------------------------
    def whole(self, events: list[Event]) -> dict[str, Any]:
        """The response once every choice has ended, from all its events in order."""
        r = self.r
        texts = [r.prompt_texts[i // r.n] if r.echo else "" for i in range(r.choices)]
        entries: list[list[Logprob]] = [[] for _ in texts]
        finish: list[str | None] = [None] * len(texts)
        for e in events:
            i = e.index
            entries[i] += self._prompt_entries(i // r.n, e)
            texts[i] += e.text
            if e.logprob is not None:
                entries[i].append(e.logprob)
            if e.token is not None:
                self.generated[i] += 1
            finish[i] = e.finish or finish[i]
        choices = []
        for i, text in enumerate(texts):
            lp = self.logprobs(i, entries[i])
            if self.chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text,
                                                        "refusal": None},
                                "logprobs": lp, "finish_reason": finish[i]})
            else:
                choices.append({"text": text, "index": i, "logprobs": lp,
                                "finish_reason": finish[i]})
        return {**self._head(chunk=False), "choices": choices, "usage": self.usage()}
