"""Output of a given shape: a JSON schema, any JSON object, or a regular expression, enforced as a
token mask over the model's own vocabulary.

At every step the sampler may draw only the tokens whose bytes keep the text generated so far
a prefix of some text the grammar accepts, A_t; the others get logit -inf:

    z_i <- z_i            if i in A_t
    z_i <- -inf           otherwise            (before the repetition penalty, temperature,
                                                top-k, top-p and min-p: sheepop.generation
                                                .generate.next_token)

so every filter after it renormalises over the allowed tokens only, and any draw continues a
valid text. The end of a sequence (its end ids: EOS, a chat's turn end) is in A_t exactly when
the text so far is complete, and is all of A_t once nothing may follow; special tokens never
are. Each sequence keeps its own state (`ConstraintState`), advanced by every token it draws,
so the rows of a batch may follow different grammars.

A JSON number's digits are bounded on top of the grammar (sheepop.generation.number_digits: at
most 15 in its integer part and fraction, 3 in its exponent, unless the schema needs more), so a
sampled answer cannot spend its tokens inside one number; a regular expression is taken as
written.

What it promises, and where it stops: a sequence that ends on an end id is valid. One cut short
(`max_tokens`, the context's end, a stop string) is a valid prefix, not a valid text. The grammar
sees the generated text only, never the prompt.

The masks are computed by llguidance (PyPI `llguidance`, Rust, no dependencies, 8 MB): on
SmolLM2's 49,152-token vocabulary it builds its tables in ~0.5 s once per tokenizer, compiles a
nested schema in milliseconds and computes a mask in ~0.1 ms, and it refuses by name every JSON
Schema keyword it cannot enforce (uniqueItems, contains, not, if/then/else, oneOf, ...) where
xgrammar and outlines-core accept several of them and ignore them; benchmarks/
constraint_libraries.py measures the three, docs/serve.md gives the figures. A refusal here is
`UnsupportedConstraint`, one line naming the keyword.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sheepop.errors import UserError
from sheepop.generation.number_digits import DigitTable, Place

KINDS = ("json_object", "json_schema", "regex")
# JSON on one line, a space after ':' and ',' and none elsewhere: Python's json.dumps, the form
# a model has read most. A free choice of whitespace (llguidance's default) lets a sampled
# sequence spend its tokens on blank lines and never close the object.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class UnsupportedConstraint(UserError):
    """A schema, or a regular expression, that cannot be enforced (its message says what)."""


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must match: `kind` one of KINDS; `source` the JSON schema (a dict), the
    regular expression (a str), or None for any JSON object."""
    kind: str
    source: Any = None

    @property
    def what(self) -> str:
        return {"json_object": "a JSON object", "json_schema": "the JSON schema",
                "regex": f"the regular expression {self.source!r}"}[self.kind]


class ConstrainedTokenizer(Protocol):
    """What the vocabulary is read from (sheepop.tokenizers.Tokenizer)."""
    vocab_size: int
    eos_id: int | None

    def vocabulary_bytes(self) -> list[bytes | None]: ...

    def encode(self, text: str) -> list[int]: ...


class TokenVocabulary:
    """The vocabulary as llguidance matches it: each id's bytes (a special token's, which writes
    no text, can match nothing), built once per tokenizer (`vocabulary_of`)."""

    def __init__(self, tokens: Sequence[bytes | None], encode: Callable[[str], list[int]]):
        import llguidance

        specials = [i for i, t in enumerate(tokens) if t is None]
        if not specials:
            raise UserError("constrained output needs a tokenizer with an end-of-text token")

        class Wrapped:  # the fields llguidance.TokenizerWrapper reads
            eos_token_id, bos_token_id, special_token_ids = specials[0], None, specials

            def __call__(self, data: bytes) -> list[int]:  # (used for a grammar's literals)
                return encode(data.decode("utf-8", "replace"))
        wrapped = Wrapped()
        # (0xFF never begins UTF-8: llguidance reads such a token as special, matching no text)
        wrapped.tokens = [b"\xff[special]" if t is None else t for t in tokens]
        self.size, self.tokens = len(tokens), list(tokens)
        self._digits: DigitTable | None = None
        self.special = np.zeros(self.size, dtype=bool)
        self.special[specials] = True
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapped))

    @property
    def digits(self) -> DigitTable:
        """Each token's digits, for the bound on a JSON number's (built on first use)."""
        if self._digits is None:
            self._digits = DigitTable(self.tokens)
        return self._digits


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary_of(tokenizer: ConstrainedTokenizer) -> TokenVocabulary:
    """The tokenizer's `TokenVocabulary`, built on first use and kept while the tokenizer lives
    (0.5 s for SmolLM2's 49,152 ids: once per server, not once per request)."""
    found = _VOCABULARIES.get(tokenizer)
    if found is None:
        found = _VOCABULARIES[tokenizer] = TokenVocabulary(tokenizer.vocabulary_bytes(),
                                                          tokenizer.encode)
    return found


def _grammar(spec: ConstraintSpec) -> str:
    from llguidance import LLMatcher

    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.source)
    schema = {"type": "object"} if spec.kind == "json_object" else spec.source
    if not isinstance(schema, dict):
        raise UnsupportedConstraint(f"a JSON schema must be a JSON object, not "
                                    f"{type(schema).__name__}")
    return LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)


class Constraint:
    """A compiled grammar over one vocabulary; `start` gives each sequence its own state."""

    def __init__(self, spec: ConstraintSpec, vocabulary: TokenVocabulary):
        from llguidance import LLMatcher

        if spec.kind not in KINDS:
            raise ValueError(f"constraint kind {spec.kind!r}: not one of {KINDS}")
        self.spec, self.vocabulary = spec, vocabulary
        self.grammar = _grammar(spec)
        failed, messages = LLMatcher.validate_grammar_with_warnings(self.grammar,
                                                                    vocabulary.tokenizer)
        if failed or messages:  # (a warning is a keyword it would not enforce: refused too)
            said = "; ".join(" ".join(m.split()) for m in messages)
            raise UnsupportedConstraint(f"{spec.what} cannot be enforced: {said}")

    def start(self, end_ids: Collection[int]) -> ConstraintState:
        """A fresh state for one sequence that ends on any of `end_ids`."""
        return ConstraintState(self, end_ids)


class ConstraintState:
    """One sequence's place in the grammar: which tokens may come next (`allowed`), and the
    token drawn (`advance`)."""

    def __init__(self, constraint: Constraint, end_ids: Collection[int]):
        from llguidance import LLMatcher

        if not end_ids:
            raise UserError("constrained output needs a token that ends it (an EOS)")
        vocab = constraint.vocabulary
        self.constraint, self.end_ids = constraint, sorted(end_ids)
        self.matcher = LLMatcher(vocab.tokenizer, constraint.grammar, log_level=0)
        self._bits = np.full((vocab.size + 31) // 32, -1, dtype=np.int32)
        self.ended = False
        # where the text is in a JSON number (None: a regular expression, whose digits are
        # the user's own choice)
        self.place = None if constraint.spec.kind == "regex" else Place()

    def allowed(self, size: int) -> np.ndarray:
        """Bool (size,): the tokens that may come next (ids past the vocabulary never)."""
        out = np.zeros(size, dtype=bool)
        if self.ended:
            return out
        n = min(size, self.constraint.vocabulary.size)
        out[:n] = self._grammar_mask()[:n]
        ends = [i for i in self.end_ids if i < size]
        out[ends] = self.matcher.is_accepting()
        if self.place is not None:
            out[:n] = self._within_digits(out[:n])
        return out

    def _grammar_mask(self) -> np.ndarray:
        """A_t without the end ids: bool over the vocabulary, special tokens never."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        vocab = self.constraint.vocabulary
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:vocab.size]
        return bits.astype(bool) & ~vocab.special

    def _within_digits(self, allowed: np.ndarray) -> np.ndarray:
        """B_t from A_t = `allowed` (sheepop.generation.number_digits), or A_t where B_t is
        empty. A token that takes a number to the bound is kept only if the grammar then
        allows something other than one more digit (an end, a comma, an exponent)."""
        table = self.constraint.vocabulary.digits
        over, edge = table.row(self.place)
        n = len(allowed)
        kept = allowed & ~over[:n]
        for token in np.flatnonzero(kept & edge[:n]):
            kept[token] = self._can_stop_after(int(token), table.after(self.place, int(token)))
        return kept if kept.any() else allowed

    def _can_stop_after(self, token: int, place: Place) -> bool:
        """Whether, after `token` (a number then at the bound, at `place`), the grammar allows
        an end or a token within the bound: consumed, asked, rolled back."""
        table = self.constraint.vocabulary.digits
        self.matcher.consume_token(token)
        try:
            if self.matcher.is_accepting():
                return True
            return bool((self._grammar_mask() & ~table.row(place)[0]).any())
        finally:
            self.matcher.rollback(1)

    def advance(self, token: int) -> None:
        """Take the token drawn (one `allowed` permitted: anything else is a bug)."""
        if token in self.end_ids:
            self.ended = True
            return
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            raise RuntimeError(f"token {token} broke the constraint: "
                               f"{self.matcher.get_error()}")
        if self.place is not None:
            self.place = self.constraint.vocabulary.digits.after(self.place, token)


def compile_constraint(spec: ConstraintSpec | None, tokenizer: ConstrainedTokenizer
                       ) -> Constraint | None:
    """The spec compiled over the tokenizer's vocabulary (None: no constraint), or
    UnsupportedConstraint naming what cannot be enforced."""
    return None if spec is None else Constraint(spec, vocabulary_of(tokenizer))
