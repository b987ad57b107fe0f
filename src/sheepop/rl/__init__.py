"""Reinforcement learning with verifiable rewards: `sheepop rl` (docs/finetune.md,
"Reinforcement learning"; docs/derivations/policy-gradient.md).

- `verifiers`  what scores an answer (integer, exact, regex, progression, module:function)
- `tasks`      the prompts: JSON Lines or a built-in task, split and encoded
- `rollouts`   k answers a prompt from the batched generator; held-out pass@1
- `groups`     group-normalised advantages; the answers as one training batch
- `objective`  the clipped, token-level policy-gradient loss and its KL term, with dL/dlogp
- `run`, `start`, `loop`  the command's settings, its start (fresh or resumed), its loop
"""
