"""What both engines share that is not arithmetic (docs/architecture.md, "Shared by both engines").

The torch engine (`sheepop.model`) and the NumPy engine (`sheepop.scratch`) compute the same
model; everything about it that is bookkeeping rather than mathematics is written once, here:

- `params`: the initialisation rule and the weight-decay rule, by parameter name;
- `batch`: left padding of a batch of prompts and the rule for which keys a query may see;
- `kv_cache`: the key/value cache's bookkeeping (the engines only allocate its buffers);
- `lm`: the next-token interface of the generation loops, single and batched, with its batch
  bookkeeping (the engines only compute logits).

NumPy only, no torch: both engines import it, it imports neither.
"""

IGNORE_INDEX = -1
"""A target that counts in no loss (padding); as torch's `ignore_index`."""

PAD_ID = 0
"""The token id written in padding positions. Any valid id works: a padding position is
embedded like any token, but no real token ever attends to it, and its target is IGNORE_INDEX."""
