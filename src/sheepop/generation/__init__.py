"""From a model's logits to text: the next-token interface (lm), the sampling rule (sample), the
loops (generate), text streaming and stop strings (text_stream), continuous batching
(running_batch)."""
