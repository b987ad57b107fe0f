"""The layer kinds a config can choose for its positions, norms and feed-forward networks, and
what each costs in parameters: the one list of them (sheepop.config.schema's allowed values are its
keys) and the numbers the size rule (sheepop.config.model_size) needs to refuse a config before
anything is allocated. A new kind is one line here, plus its unit in each engine
(docs/architecture.md).
"""

POSITION_KINDS = {"sinusoidal": "absolute", "learned": "absolute", "rope": "relative",
                  "rope_terms": "relative", "rope_places": "relative", "none": "none"}
"""Where a position kind acts, and what attention then depends on. Absolute kinds add a table
row to each token embedding (a position past the table does not exist); a relative kind
(rope) rotates queries and keys so that q . k depends only on the offset between them, which
lets a KV cache slide past the context (sheepop.arch.kv_cache). `none` adds and turns nothing
(only the causal mask tells positions apart), for models whose positions come from digit places
and term indices alone; `rope_terms` rotates by the term index of each token (the number it
belongs to, digits tokenizer) instead of its position, so attention sees which number a key is
in relative to the query's but not where inside it; `rope_places` by (term index, digit place),
half the rotation pairs each. Digit places and term indices
(model.digit_positions = R, model.term_positions = S) are not kinds but additions to any of
them: learned (R, d) and (S, d) tables read at each digit's place in its number and at each
token's term index ((R + S) d parameters, sheepop.config.model_size)."""

NORM_VECTORS = {"layernorm": 2, "rmsnorm": 1}
"""A norm kind's parameter vectors of width d: layernorm's gain and shift, rmsnorm's gain."""

FFN_SHAPES = {"mlp": {"matrices": 2, "biases": 1}, "swiglu": {"matrices": 3, "biases": 2}}
"""A feed-forward kind's d x d_ff matrices, and its bias vectors of width d_ff (with model.bias;
the output projection's bias of width d is always one): mlp's fc and proj; swiglu's gate, up
and proj."""

GATE_ACTIVATION = {"swiglu": "silu"}
"""The activation a gated feed-forward kind computes whatever model.activation says (that
setting is mlp's): swiglu's gate is silu. An importer of a gated model writes it as the model's
activation, so that the run's config.json says what runs (SmolLM2 imported read 'gelu', the
default)."""


def default_ffn_width(kind: str, d: int) -> int:
    """The hidden width f when model.d_ff is 0. mlp: 4d (GPT-2). swiglu: its three matrices at
    f = 8d/3 cost what mlp's two cost at 4d (Shazeer 2020, Llama), rounded to a multiple of 64
    (whole SIMD tiles; never below 64)."""
    if kind == "swiglu":
        return max(64, 64 * round(8 * d / 3 / 64))
    return 4 * d
