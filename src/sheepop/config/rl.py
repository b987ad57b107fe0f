"""The settings of `sheepop rl`, a section of the config like the others ([rl];
sheepop.config.schema): which prompts, which verifier, and the policy-gradient step's numbers
(docs/derivations/policy-gradient.md). The command records them in its run's rl.json;
`sheepop train` refuses them. The prompts per step are train.batch_size, the learning rate and
the steps train.lr and train.steps, as for every trainer."""

from __future__ import annotations

from dataclasses import dataclass

from sheepop.config.setting import setting

# Built-in prompt sets (sheepop.rl.tasks); "file": the JSON Lines of --prompts.
RL_TASKS = ("file", "addition", "progression")
# The KL estimators of KL(pi || pi_ref) from samples of pi, r = log pi_ref - log pi per token:
# k1 = -r, k2 = r^2 / 2, k3 = e^r - 1 - r (docs/derivations/policy-gradient.md).
KL_ESTIMATORS = ("k3", "k1", "k2")


@dataclass
class RlConfig:
    """How `sheepop rl` samples, scores and steps (recorded in its run's rl.json)."""
    task: str = setting("file", "the prompts: file (the JSON Lines of --prompts), or a built-in "
                        "task: addition ('What is A + B?', answer A + B), progression (the "
                        "terms of an arithmetic progression, answer the next ones)", RL_TASKS)
    verifier: str = setting("", "what scores an answer: integer (its last integer equals the "
                            "answer), exact (its text equals the answer), regex (the answer "
                            "field, a regular expression, matches it whole), progression (the "
                            "next terms), or module:function (your own Python, "
                            "f(answer, record) -> reward); empty: the task's own (file: exact)")
    group_size: int = setting(8, "k, the answers sampled per prompt: each answer's advantage is "
                              "its reward less its group's mean")
    scale_rewards: bool = setting(False, "divide each advantage by its group's standard "
                                  "deviation as well (GRPO's form; false: the mean alone, the "
                                  "unbiased baseline)")
    updates: int = setting(1, "optimizer updates on each batch of samples (more than 1: the "
                           "importance ratio pi / pi_old is clipped to 1 +- rl.clip)")
    clip: float = setting(0.2, "epsilon of the clipped ratio min(rho A, clip(rho, 1 - eps, "
                          "1 + eps) A)")
    kl: float = setting(0.0, "beta, the weight of the KL term to the starting model (0: none, "
                        "the reference is never computed)")
    kl_estimator: str = setting("k3", "the per-token estimator of KL(pi || pi_ref) the loss "
                                "adds", KL_ESTIMATORS)
    max_new_tokens: int = setting(32, "the longest answer sampled, in tokens")
    temperature: float = setting(1.0, "the sampling temperature (1: the policy's own "
                                 "distribution, whose log-probabilities the loss uses)")
    eval_prompts: int = setting(50, "held-out prompts whose greedy answers give pass@1 at each "
                                "evaluation (train.eval_interval; 0: none)")
    digits: int = setting(1, "addition: the digits of each operand (1: 0-9, 2: 10-99)")
    answer_terms: int = setting(1, "progression: the terms the answer writes")

    def problems(self) -> list[tuple[bool, str]]:
        """(holds, message) for each rule of these numbers (sheepop.config.checks)."""
        return [
            (self.group_size >= 2, f"rl.group_size must be at least 2 (an answer's advantage "
                                   f"is measured against its group), not {self.group_size}"),
            (self.updates >= 1, f"rl.updates must be at least 1, not {self.updates}"),
            (0 < self.clip < 1, f"rl.clip must be in (0, 1), not {self.clip}"),
            (self.kl >= 0, f"rl.kl must be >= 0 (0: no KL term), not {self.kl}"),
            (self.max_new_tokens >= 1, f"rl.max_new_tokens must be at least 1, not "
                                       f"{self.max_new_tokens}"),
            (self.temperature > 0, f"rl.temperature must be > 0 (answers are sampled), not "
                                   f"{self.temperature}"),
            (self.eval_prompts >= 0, f"rl.eval_prompts must be >= 0, not {self.eval_prompts}"),
            (1 <= self.digits <= 9, f"rl.digits must be in 1..9, not {self.digits}"),
            (self.answer_terms >= 1, f"rl.answer_terms must be at least 1, not "
                                     f"{self.answer_terms}"),
        ]
