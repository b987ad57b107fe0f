"""`sheepop finetune --method dpo`: direct preference optimisation through the shared trainer
(docs/finetune.md, "DPO"; the mathematics: docs/derivations/dpo.md).

    pairs.jsonl --(the chat template)--> (chosen, rejected) examples    sheepop.finetune.pairs
    the reference: log pi_ref of every answer, once, before any step  `Reference`
    each step: B pairs as 2B rows (c_1, r_1, c_2, r_2, ...), the policy's log pi of each,
               the DPO loss of the margins and its gradient            sheepop.finetune.dpo_loss
               through the engine's `logprob_step`                    sheepop.train.logprobs
    each evaluation: the held-out pairs' loss, mean reward margin and reward accuracy

The reference is the model before training: the base run's weights for a full fine-tune, the
base with the adapters off under LoRA (the same model: B starts at 0). Its log-probabilities are
computed once and kept in the run (`REFERENCE_FILE`), never again from the policy: a resumed run
reads them, since its weights have moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.data.conversations import pad_examples
from sheepop.errors import UserError
from sheepop.files import DocumentFormat, read_document, write_document
from sheepop.finetune.dpo_loss import dpo_loss, reward_accuracy
from sheepop.finetune.pairs import Pair
from sheepop.finetune.sampler import ChatSampler
from sheepop.train.logprobs import sequence_logprobs
from sheepop.train.loop import Trainer
from sheepop.train.progress import Progress
from sheepop.train.summary import Summary

REFERENCE_FILE = "dpo_reference.json"
REFERENCE_DOCUMENT = DocumentFormat("sheepop-dpo-reference", 1,
                                    "sheepop DPO reference log-probabilities")


def pair_rows(pairs: Sequence[Pair], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the pairs as rows c_1, r_1, c_2, r_2, ..., padded to the longest."""
    return pad_examples([example for pair in pairs for example in pair], pad_id=pad_id)


def sequence_key(x: np.ndarray, y: np.ndarray) -> bytes:
    """What a row's log-probability depends on: its tokens up to its last counted target (the
    padding after it changes nothing: a causal model never reads ahead)."""
    counted = np.flatnonzero(np.asarray(y) != IGNORE_INDEX)
    n = int(counted[-1]) + 1 if len(counted) else 0
    return np.asarray(x[:n], np.int64).tobytes() + np.asarray(y[:n], np.int64).tobytes()


class Reference:
    """log pi_ref of each answer, keyed by its tokens (`sequence_key`), computed once."""

    def __init__(self, pairs: Sequence[Pair], values: np.ndarray):
        """`values` (len(pairs), 2): (log pi_ref(c), log pi_ref(r)) of each pair."""
        self.values = np.asarray(values, np.float64).reshape(len(pairs), 2)
        self.by_key = {sequence_key(*example): float(v) for pair, vs in zip(pairs, self.values)
                       for example, v in zip(pair, vs)}

    @classmethod
    def computed(cls, engine: Any, pairs: Sequence[Pair], batch_size: int, pad_id: int,
                 adapters_off: bool) -> Reference:
        """The reference's values from `engine` as it is now (before any step; `adapters_off`:
        its base under LoRA)."""
        values = []
        for i in range(0, len(pairs), batch_size):
            x, y = pair_rows(pairs[i:i + batch_size], pad_id)
            values.append(sequence_logprobs(engine.token_logprobs(x, y, adapters_off)))
        return cls(pairs, np.concatenate(values))

    def of(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """log pi_ref of each row (B,)."""
        return np.array([self.by_key[sequence_key(xr, yr)] for xr, yr in zip(x, y)])

    def save(self, run_dir: str | Path) -> None:
        write_document(Path(run_dir) / REFERENCE_FILE, REFERENCE_DOCUMENT,
                       {"pairs": len(self.values), "log_probs": self.values.tolist()})

    @classmethod
    def load(cls, run_dir: str | Path, pairs: Sequence[Pair]) -> Reference:
        path = Path(run_dir) / REFERENCE_FILE
        d = read_document(path, REFERENCE_DOCUMENT, f"{run_dir} has no {REFERENCE_FILE}: it is "
                          "not a DPO run")
        values = np.asarray(d.get("log_probs", []), np.float64)
        if values.shape != (len(pairs), 2):
            raise UserError(f"{path} holds the reference of {d.get('pairs')} pairs, the data "
                            f"{len(pairs)}: resume with the pairs the run started with")
        return cls(pairs, values)


class DpoEngine:
    """An engine of the shared trainer (sheepop.train.loop.Engine) whose loss is DPO's: a batch
    is pairs as rows c_1, r_1, c_2, r_2, ... (`pair_rows`); everything else is the wrapped
    engine's (weights, optimizer state, parameter counts)."""

    def __init__(self, engine: Any, reference: Reference, beta: float):
        self.engine, self.reference, self.beta = engine, reference, beta
        self.name = engine.name

    def __getattr__(self, name: str) -> Any:  # weights(), optimizer_arrays(), ...: the engine's
        return getattr(self.engine, name)

    @property
    def description(self) -> str:
        return f"{self.engine.description}; DPO, beta {self.beta:g}"

    def losses(self, x: np.ndarray, y: np.ndarray, logp: np.ndarray, n: int | None = None):
        """The DPO loss of the pairs in (x, y) given their per-token log-probabilities
        (sheepop.finetune.dpo_loss.dpo_loss; `n` the step's pairs)."""
        policy, ref = sequence_logprobs(logp), self.reference.of(x, y)
        return dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], self.beta, n)

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr: float
                   ) -> tuple[float, float]:
        """One step on the mean DPO loss over every pair of the micro-batches; (that loss, the
        gradient norm before clipping)."""
        n = sum(len(x) // 2 for x, _ in micro_batches)

        def loss_of(i: int, logp: np.ndarray) -> tuple[float, np.ndarray]:
            x, y = micro_batches[i]
            out = self.losses(x, y, logp, n)
            g = np.empty_like(logp)  # dL/dlog pi of a row, the same at each of its tokens
            g[0::2], g[1::2] = out.d_chosen[:, None], out.d_rejected[:, None]
            return out.loss, g

        return self.engine.logprob_step(micro_batches, lr, loss_of)

    def margins(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The reward margins u_i of the pairs in (x, y), no dropout."""
        return self.losses(x, y, self.engine.token_logprobs(x, y)).margins

    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(sum of the pairs' DPO losses, number of pairs)."""
        u = self.margins(x, y)
        return float(np.logaddexp(0.0, -u).sum()), len(u)


class PairSampler(ChatSampler):
    """`batch_size` pairs drawn uniformly with replacement, as 2 * batch_size rows."""

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        picks = self.rng.integers(0, len(self.examples), size=self.B)
        return pair_rows([self.examples[i] for i in picks], self.pad_id)


@dataclass
class DpoSummary(Summary):
    """A DPO run's closing lines: its held-out figures are a preference's, the pairs' mean DPO
    loss, reward accuracy and mean reward margin at the last evaluation. exp(loss), the
    perplexity a fine-tune's summary gives, means nothing for a loss that is -log sigma(u)."""

    margins: np.ndarray | None = None  # the held-out pairs' reward margins u_i (None: no eval)

    def _val(self) -> str:
        if self.margins is None or self.val_loss is None:
            return super()._val()  # no held-out pairs, or no evaluation in this session
        return (f"held-out pairs: DPO loss {self.val_loss:.4f}, reward accuracy "
                f"{reward_accuracy(self.margins):.3f}, reward margin "
                f"{self.margins.mean():.4f} ({len(self.margins)} pairs)")


class DpoTrainer(Trainer):
    """The shared trainer, evaluated on held-out pairs (eval_x, eval_y: `pair_rows`): val_loss
    is their mean DPO loss, and each evaluation also records their mean reward margin and
    reward accuracy (the share of pairs whose chosen answer the policy prefers, relative to
    the reference); the run ends with a `DpoSummary`."""

    held_out: np.ndarray | None = None

    def run(self) -> DpoSummary:
        summary = super().run()
        return DpoSummary(**{f.name: getattr(summary, f.name) for f in fields(summary)},
                          margins=self.held_out)

    def evaluate(self) -> tuple[float, float | None] | None:
        if self.eval_x is None:
            return None
        rows = 2 * self.cfg.train.batch_size
        self.held_out = np.concatenate([
            self.engine.margins(self.eval_x[i:i + rows], self.eval_y[i:i + rows])
            for i in range(0, len(self.eval_x), rows)])
        return float(np.logaddexp(0.0, -self.held_out).mean()), None

    def _evaluate(self, record: dict[str, Any], shown: Progress) -> bool:
        spent = super()._evaluate(record, shown)
        if self.held_out is not None:
            record.pop("val_perplexity", None)  # (of a preference loss: no meaning)
            record["reward_margin"] = float(f"{self.held_out.mean():.7g}")
            record["reward_accuracy"] = reward_accuracy(self.held_out)
            shown.note(f"  held-out pairs: reward margin {self.held_out.mean():.4f}, reward "
                       f"accuracy {record['reward_accuracy']:.3f} ({len(self.held_out)} pairs)")
        return spent


def dpo_trainer(cfg: Any, train: Sequence[Pair], val: Sequence[Pair], tokenizer: Any,
                weights: dict[str, np.ndarray], lora: Any, run_dir: Path, resume: bool, log,
                progress: bool) -> DpoTrainer:
    """The shared trainer on `train` pairs, evaluated on `val`, its engine's loss DPO's; the
    reference computed from the engine before its first step (a new run) or read from the run
    (a resumed one)."""
    from sheepop.data.dataset import Dataset
    from sheepop.train.start import setup
    if cfg.finetune.beta <= 0:
        raise UserError(f"finetune.beta must be > 0, not {cfg.finetune.beta}")
    t, pad = cfg.train, tokenizer.pad_id if tokenizer.pad_id is not None else 0
    everything = [*train, *val]

    def with_dpo_loss(engine: Any) -> DpoEngine:
        if resume:
            reference = Reference.load(run_dir, everything)
        else:
            reference = Reference.computed(engine, everything, t.batch_size, pad,
                                           adapters_off=lora is not None)
            log(f"reference: log pi_ref of {2 * len(everything):,} answers computed once ("
                f"{'the base, adapters off' if lora is not None else 'the model before training'}"
                f"), kept in {REFERENCE_FILE}")
        return DpoEngine(engine, reference, cfg.finetune.beta)

    flat = np.concatenate([x for pair in train for x, _ in pair]).astype(np.int64)
    dataset = Dataset(flat, np.zeros(0, np.int64), tokenizer,
                      [f"preference pairs: {len(train):,} train, {len(val):,} held out"])
    trainer = setup(None, cfg, run_dir, resume=resume, log=log, progress=progress,
                    dataset=dataset, sampler=PairSampler(train, t.batch_size, t.seed, pad),
                    eval_data=pair_rows(val, pad) if val else None, initial_weights=weights,
                    lora=lora, wrap_engine=with_dpo_loss, trainer_class=DpoTrainer)
    if not resume:
        trainer.engine.reference.save(run_dir)
    return trainer
