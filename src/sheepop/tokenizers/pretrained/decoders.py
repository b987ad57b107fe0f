"""Decoders of a Hugging Face tokenizer.json: token strings -> text.

`Decoder.decode(tokens)` is `tokenizers`' decode exactly: each step maps the list of token
strings to a new list, and the result is their concatenation (with no decoder at all, the
tokens joined by spaces). The steps:

- ByteLevel: each token's characters back to the bytes they stand for (GPT-2's byte map; a token
  holding any other character is kept as its own UTF-8), all tokens' bytes read as one UTF-8 text
  (invalid bytes -> U+FFFD), giving one string;
- ByteFallback: runs of `<0xNN>` tokens become the text of their bytes, or one U+FFFD per token
  when those bytes are not valid UTF-8;
- Metaspace: the replacement character (▁) becomes a space, except that in the first token
  every ▁ is dropped (unless prepend_scheme is "never");
- Replace (literal or regex, in each token), Fuse (all tokens into one), Strip (up to `start`
  copies of `content` from each token's start, `stop` from its end), Sequence.

`Decoder.token_bytes(token, first)` is the same rule for one token at a time, for streaming
(sheepop.tokenizers.streaming): ByteLevel and ByteFallback give raw bytes, which the stream
decodes as UTF-8 once a character is complete; after a Fuse, Strip's `start` applies to the
first token only and its `stop` (the end of the whole text, unknown while streaming) is not
applied. For valid UTF-8 the two agree (Llama's Strip has stop 0).
"""

from __future__ import annotations

from typing import Any

from sheepop.tokenizers.pretokenize import unicode_to_bytes
from sheepop.tokenizers.pretrained.spec import Spec, one_char, pattern_regex, sequence

Piece = str | bytes


def _byte_of(token: str) -> int | None:
    """The byte of a `<0xNN>` byte-fallback token, or None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


class _Step:
    def exact(self, tokens: list[str]) -> list[str]:
        raise NotImplementedError

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        """(the piece after this step, whether the tokens have been fused by now)."""
        raise NotImplementedError


class _ByteLevel(_Step):
    def _bytes(self, token: str) -> bytes:
        table = unicode_to_bytes()
        try:
            return bytes(table[c] for c in token)
        except KeyError:
            return token.encode("utf-8", "surrogatepass")

    def exact(self, tokens: list[str]) -> list[str]:
        return [b"".join(map(self._bytes, tokens)).decode("utf-8", "replace")]

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        return (self._bytes(piece) if isinstance(piece, str) else piece), fused


class _ByteFallback(_Step):
    def exact(self, tokens: list[str]) -> list[str]:
        out: list[str] = []
        run: list[int] = []

        def flush() -> None:
            try:
                out.append(bytes(run).decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" for _ in run)
            run.clear()
        for token in tokens:
            b = _byte_of(token)
            if b is None:
                if run:
                    flush()
                out.append(token)
            else:
                run.append(b)
        if run:
            flush()
        return out

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        b = _byte_of(piece) if isinstance(piece, str) else None
        return (piece if b is None else bytes([b])), fused


class _Fuse(_Step):
    def exact(self, tokens: list[str]) -> list[str]:
        return ["".join(tokens)]

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        return piece, True


class _Strip(_Step):
    def __init__(self, spec: Spec) -> None:
        self.content = one_char(spec, "content")
        self.start, self.stop = spec.get("start", int), spec.get("stop", int)

    def _cut(self, token: str, start: int, stop: int) -> str:
        a = 0
        while a < min(start, len(token)) and token[a] == self.content:
            a += 1
        b = len(token)
        while len(token) - b < stop and b > a and token[b - 1] == self.content:
            b -= 1
        return token[a:b]

    def exact(self, tokens: list[str]) -> list[str]:
        return [self._cut(t, self.start, self.stop) for t in tokens]

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        start = self.start if (first or not fused) else 0
        stop = 0 if fused else self.stop
        text = piece if isinstance(piece, str) else _as_text(piece)
        if text is None:
            return piece, fused
        return self._cut(text, start, stop), fused


class _Replace(_Step):
    def __init__(self, spec: Spec) -> None:
        self.pattern, self.content = pattern_regex(spec), spec.get("content", str)

    def _sub(self, token: str) -> str:
        return self.pattern.sub(lambda _: self.content, token)

    def exact(self, tokens: list[str]) -> list[str]:
        return [self._sub(t) for t in tokens]

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        text = piece if isinstance(piece, str) else _as_text(piece)
        return (piece if text is None else self._sub(text)), fused


class _Metaspace(_Step):
    def __init__(self, spec: Spec) -> None:
        self.replacement = one_char(spec, "replacement")
        spec.ignore("str_rep", "split")
        legacy = spec.get("add_prefix_space", bool, None)
        scheme = spec.get("prepend_scheme", str, "always" if legacy in (True, None) else "never")
        self.strip_first = scheme != "never"

    def _one(self, token: str, first: bool) -> str:
        return token.replace(self.replacement, "" if (first and self.strip_first) else " ")

    def exact(self, tokens: list[str]) -> list[str]:
        return [self._one(t, k == 0) for k, t in enumerate(tokens)]

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        text = piece if isinstance(piece, str) else _as_text(piece)
        return (piece if text is None else self._one(text, first)), fused


class _Sequence(_Step):
    def __init__(self, steps: list[_Step]) -> None:
        self.steps = steps

    def exact(self, tokens: list[str]) -> list[str]:
        for step in self.steps:
            tokens = step.exact(tokens)
        return tokens

    def stream(self, piece: Piece, first: bool, fused: bool) -> tuple[Piece, bool]:
        for step in self.steps:
            piece, fused = step.stream(piece, first, fused)
        return piece, fused


def _as_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _build(data: Any, where: str) -> _Step:
    spec = Spec(data, where)
    kind = spec.type
    if kind == "ByteLevel":
        spec.ignore("add_prefix_space", "trim_offsets", "use_regex")
        step: _Step = _ByteLevel()
    elif kind == "ByteFallback":
        step = _ByteFallback()
    elif kind == "Fuse":
        step = _Fuse()
    elif kind == "Strip":
        step = _Strip(spec)
    elif kind == "Replace":
        step = _Replace(spec)
    elif kind == "Metaspace":
        step = _Metaspace(spec)
    elif kind == "Sequence":
        step = _Sequence([_build(item, f"{where}[{k}]")
                          for k, item in enumerate(sequence(spec, "decoders"))])
    else:
        raise spec.error("this decoder is not supported (sheepop reads ByteLevel, ByteFallback, "
                         "Metaspace, Replace, Fuse, Strip, Sequence)")
    spec.done()
    return step


class Decoder:
    """tokenizer.json's "decoder" (None: tokens joined by spaces, as `tokenizers` does)."""

    def __init__(self, data: Any, where: str) -> None:
        self._step = None if data is None else _build(data, where)

    def decode(self, tokens: list[str]) -> str:
        if self._step is None:
            return " ".join(tokens)
        return "".join(self._step.exact(tokens))

    def token_bytes(self, token: str, first: bool) -> bytes:
        """The bytes one token adds to a streamed text (module docstring)."""
        if self._step is None:
            return (token if first else " " + token).encode("utf-8", "surrogatepass")
        piece, _ = self._step.stream(token, first, False)
        return piece if isinstance(piece, bytes) else piece.encode("utf-8", "surrogatepass")
