"""Three libraries that turn a JSON schema into a token mask, measured on one model's vocabulary:
llguidance, xgrammar and outlines-core (docs/serve.md, "Structured output", says which one
sheepop uses and why).

    sheepop import SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol
    python benchmarks/constraint_libraries.py --run /tmp/smol
    python benchmarks/constraint_libraries.py --run /tmp/smol --path /tmp/xgrammar-target

Each library that imports is timed on: building its vocabulary from the tokenizer's byte
strings, compiling a nested schema (objects, arrays, enums, bounded numbers, a pattern, required
fields), and the mask of the next token at every token of a valid instance (median of the
steps). Then every JSON Schema keyword of FEATURES is put to it: a schema using it, an instance
that satisfies it and one that breaks only it, fed token by token: "enforced" when the first
passes and the second is stopped, "IGNORED" when the second passes too, "refused" when compiling
fails (its message shown). `--path` adds a folder to the end of sys.path (a library installed
with `pip install --target`, so that it does not replace the environment's own packages).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1},
                   "minItems": 1, "maxItems": 4},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "properties": {"key": {"type": "string", "maxLength": 10},
                                             "on": {"type": "boolean"}},
            "required": ["key", "on"], "additionalProperties": False}},
    },
    "required": ["name", "age", "role", "scores", "address"],
    "additionalProperties": False,
}
NESTED_VALID = {"name": "Ada", "age": 36, "role": "admin", "scores": [0.5, 1],
                "address": {"city": "London", "zip": "12345"},
                "tags": [{"key": "math", "on": True}]}

S, I, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}
# keyword: (schema, an instance that satisfies it, one that breaks only it)
FEATURES: dict[str, tuple[dict, Any, Any]] = {
    "minLength/maxLength": ({**S, "minLength": 2, "maxLength": 4}, "abc", "abcdef"),
    "pattern": ({**S, "pattern": "^[a-z]+[0-9]$"}, "ab1", "ab12"),
    "format: date": ({**S, "format": "date"}, "2024-05-01", "May 1"),
    "format: email": ({**S, "format": "email"}, "a@b.co", "nobody"),
    "format: uuid": ({**S, "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "x"),
    "minimum/maximum": ({**I, "minimum": 1, "maximum": 9}, 5, 12),
    "exclusiveMinimum": ({**N, "exclusiveMinimum": 0}, 0.5, 0),
    "multipleOf": ({**I, "multipleOf": 5}, 15, 7),
    "enum": ({"enum": ["red", "green"]}, "red", "blue"),
    "const": ({"const": "yes"}, "yes", "no"),
    "minItems/maxItems": ({"type": "array", "items": I, "minItems": 1, "maxItems": 2}, [1],
                          [1, 2, 3]),
    "uniqueItems": ({"type": "array", "items": I, "uniqueItems": True}, [1, 2], [1, 1]),
    "prefixItems": ({"type": "array", "prefixItems": [I, S], "items": False}, [1, "a"],
                    ["a", 1]),
    "contains": ({"type": "array", "items": I, "contains": {"const": 3}}, [1, 3], [1, 2]),
    "required": ({"type": "object", "properties": {"a": I}, "required": ["a"]}, {"a": 1}, {}),
    "additionalProperties: false": ({"type": "object", "properties": {"a": I},
                                     "additionalProperties": False}, {"a": 1}, {"a": 1, "b": 2}),
    "additionalProperties: schema": ({"type": "object", "additionalProperties": I}, {"x": 1},
                                     {"x": "s"}),
    "patternProperties": ({"type": "object", "patternProperties": {"^n_": I},
                           "additionalProperties": False}, {"n_a": 1}, {"m": 1}),
    "minProperties": ({"type": "object", "additionalProperties": I, "minProperties": 1},
                      {"a": 1}, {}),
    "anyOf": ({"anyOf": [I, {"type": "boolean"}]}, True, "s"),
    "oneOf": ({"oneOf": [{**I, "maximum": 5}, {**I, "minimum": 3}]}, 1, 4),
    "allOf": ({"allOf": [{**I, "minimum": 3}, {**I, "maximum": 5}]}, 4, 7),
    "$ref (recursive)": ({"$defs": {"node": {"type": "object", "properties": {
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["next"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
        {"next": {"next": None}}, {"next": {}}),
    "not": ({**I, "not": {"const": 3}}, 2, 3),
    "if/then/else": ({"type": "integer", "if": {"minimum": 10}, "then": {"multipleOf": 2},
                      "else": {"maximum": 5}}, 12, 7),
    "dependentRequired": ({"type": "object", "properties": {"a": I, "b": I},
                           "dependentRequired": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
}


class Library:
    """One library behind four calls: compile a schema, a fresh matcher, its mask, a token."""
    name = ""

    def __init__(self, tokens: list[bytes | None], eos: int, encode: Callable[[bytes], list[int]]):
        raise NotImplementedError

    def compile(self, schema: dict) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def mask(self, m: Any) -> np.ndarray: ...  # bool (V,)
    def accept(self, m: Any, token: int) -> bool: ...


class LLGuidance(Library):
    name = "llguidance"

    def __init__(self, tokens, eos, encode):
        import llguidance
        import llguidance.numpy as lnp
        self.lib, self.lnp, self.V = llguidance, lnp, len(tokens)

        class Vocab:  # what llguidance.TokenizerWrapper reads
            eos_token_id, bos_token_id = eos, None
            special_token_ids = [i for i, t in enumerate(tokens) if t is None]
            def __call__(self, data: bytes) -> list[int]:
                return encode(data)
        v = Vocab()
        v.tokens = [b"\xff<special>" if t is None else t for t in tokens]
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(v))
        self.bits = lnp.allocate_token_bitmask(1, self.V)

    def compile(self, schema):
        grammar = self.lib.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        error = self.lib.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(error)
        return grammar

    def matcher(self, compiled):
        return self.lib.LLMatcher(self.tokenizer, compiled, log_level=0)

    def mask(self, m):
        self.lnp.fill_next_token_bitmask(m, self.bits)
        return np.unpackbits(self.bits.view(np.uint8), bitorder="little")[:self.V].astype(bool)

    def accept(self, m, token):
        return m.consume_token(token) and not m.is_error()


class XGrammar(Library):
    name = "xgrammar"

    def __init__(self, tokens, eos, encode):
        import xgrammar
        self.lib, self.V = xgrammar, len(tokens)
        info = xgrammar.TokenizerInfo([b"" if t is None else t for t in tokens],
                                      xgrammar.VocabType.RAW, vocab_size=self.V,
                                      stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.bits = xgrammar.allocate_token_bitmask(1, self.V)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), strict_mode=True)

    def matcher(self, compiled):
        return self.lib.GrammarMatcher(compiled)

    def mask(self, m):
        m.fill_next_token_bitmask(self.bits)
        return np.unpackbits(self.bits.numpy().view(np.uint8), bitorder="little")[:self.V] \
            .astype(bool)

    def accept(self, m, token):
        return m.accept_token(token)


class OutlinesCore(Library):
    name = "outlines-core"

    def __init__(self, tokens, eos, encode):
        import outlines_core
        self.lib, self.V, self.eos = outlines_core, len(tokens), eos
        by_bytes: dict[bytes, list[int]] = {}
        for i, t in enumerate(tokens):
            if t is not None and i != eos:
                by_bytes.setdefault(t, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, by_bytes)

    def compile(self, schema):
        regex = self.lib.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.lib.Index(regex, self.vocab)

    def matcher(self, compiled):
        return self.lib.Guide(compiled)

    def mask(self, m):
        out = np.zeros(self.V, dtype=bool)
        out[m.get_tokens()] = True
        return out

    def accept(self, m, token):
        if token == self.eos:  # (advance has no state after EOS: the end is a final state)
            return m.is_finished()
        if token not in m.get_tokens():
            return False
        m.advance(token, return_tokens=False)
        return True


LIBRARIES = [LLGuidance, XGrammar, OutlinesCore]


def passes(lib: Library, compiled: Any, ids: list[int], eos: int) -> bool:
    """Whether the matcher takes every token of `ids` (each in its mask) and then EOS."""
    m = lib.matcher(compiled)
    for t in [*ids, eos]:
        if not lib.mask(m)[t] or not lib.accept(m, t):
            return False
    return True


def features(lib: Library, encode_text: Callable[[str], list[int]], eos: int) -> dict[str, str]:
    out = {}
    for name, (schema, good, bad) in FEATURES.items():
        try:
            compiled = lib.compile(schema)
        except Exception as e:  # (each library raises its own kind)
            out[name] = "refused: " + " ".join(str(e).split())[:90]
            continue
        ok = passes(lib, compiled, encode_text(json.dumps(good)), eos)
        stopped = not passes(lib, compiled, encode_text(json.dumps(bad)), eos)
        out[name] = ("enforced" if ok and stopped else "IGNORED" if ok else
                     "rejects a valid instance")
    return out


def measure(cls: type[Library], tokens, eos, encode_bytes, encode_text) -> dict[str, Any]:
    t_import = time.perf_counter()
    __import__({"outlines-core": "outlines_core"}.get(cls.name, cls.name))
    t0 = time.perf_counter()
    lib = cls(tokens, eos, encode_bytes)
    t1 = time.perf_counter()
    compiled = lib.compile(NESTED)
    lib.matcher(compiled)  # (llguidance builds its lexer here: counted as compiling)
    t2 = time.perf_counter()
    ids = encode_text(json.dumps(NESTED_VALID))
    m, steps = lib.matcher(compiled), []
    for t in [*ids, eos]:
        s = time.perf_counter()
        allowed = lib.mask(m)
        steps.append(time.perf_counter() - s)
        assert allowed[t] and lib.accept(m, t), f"{cls.name} refused token {t} of a valid instance"
    return {"import_s": t0 - t_import, "vocabulary_s": t1 - t0, "compile_s": t2 - t1,
            "tokens": len(ids) + 1,
            "mask_ms_median": 1e3 * statistics.median(steps), "mask_ms_max": 1e3 * max(steps),
            "features": features(lib, encode_text, eos)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a run directory (its tokenizer is used)")
    ap.add_argument("--path", action="append", default=[],
                    help="a folder added to the end of sys.path (e.g. a pip --target install)")
    args = ap.parse_args()
    sys.path.extend(args.path)
    from sheepop.tokenizers import load
    tok = load(f"{args.run}/tokenizer.json")
    tokens, eos = tok.vocabulary_bytes(), tok.eos_id
    print(f"vocabulary: {len(tokens):,} ids ({sum(t is None for t in tokens)} special), "
          f"EOS {eos}")

    def encode_text(text: str) -> list[int]:
        return tok.encode(text)

    def encode_bytes(data: bytes) -> list[int]:
        return tok.encode(data.decode("utf-8", "replace"))

    results = {}
    for cls in LIBRARIES:
        try:
            results[cls.name] = measure(cls, tokens, eos, encode_bytes, encode_text)
        except ImportError as e:
            print(f"{cls.name}: not installed ({e})")
            continue
        r = results[cls.name]
        print(f"{cls.name}: import {r['import_s']:.2f} s, vocabulary {r['vocabulary_s']:.2f} s, "
              f"nested schema compiled in {r['compile_s']:.3f} s, mask per token median "
              f"{r['mask_ms_median']:.3f} ms "
              f"(max {r['mask_ms_max']:.2f} ms, {r['tokens']} tokens)")
    names = list(results)
    if names:
        print("\n| JSON Schema keyword | " + " | ".join(names) + " |")
        print("|---" * (len(names) + 1) + "|")
        for feature in FEATURES:
            print(f"| {feature} | " + " | ".join(results[n]["features"][feature] for n in names)
                  + " |")


if __name__ == "__main__":
    main()
