"""The layer kinds a config can choose for its norms and feed-forward networks, and what each
costs in parameters: the one list of them (sheepop.config's allowed values are its keys) and
the numbers the size rule (sheepop.model_size) needs to refuse a config before anything is
allocated. A new kind is one line here, plus its unit in each engine (docs/architecture.md).
"""

NORM_VECTORS = {"layernorm": 2, "rmsnorm": 1}
"""A norm kind's parameter vectors of width d: layernorm's gain and shift, rmsnorm's gain."""

FFN_SHAPES = {"mlp": {"matrices": 2, "biases": 1}}
"""A feed-forward kind's d x d_ff matrices, and its bias vectors of width d_ff (with model.bias;
the output projection's bias of width d is always one): mlp's fc and proj."""
