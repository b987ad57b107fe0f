"""Fine-tuning: teaching a pretrained model to answer (docs/finetune.md).

- `tasks`  the built-in demonstration: small checkable instructions as conversations, a
           train/held-out split by construction, and the exact-answer scorer.
"""
