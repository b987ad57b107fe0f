"""Training on several processes: PyTorch's DistributedDataParallel (or FSDP) under torchrun.

torchrun starts one process ("rank") per device and gives each RANK, LOCAL_RANK and WORLD_SIZE;
`session()` joins them into a process group (gloo on CPU, NCCL on CUDA) with a timeout, so a
rank that crashes or hangs stops the job with an error instead of a silent wait.

The data. Every rank runs the same window sampler (same seed, same state) and draws the *global*
micro-batch of W * B windows (W ranks, B = train.batch_size per rank); rank r keeps rows
[r*B, (r+1)*B). So W processes with batch B train on exactly the windows of one process with
batch W*B, and the sampler's state, which is the same on every rank, is the whole job's position
in the data: a checkpoint resumes on any number of ranks (with W'*B' = W*B it continues the
same batches).

The gradient. With N the counted (non-padding) targets of the whole step on all ranks
(all-reduced), rank r back-propagates  W * (sum of its token losses) / N  for each micro-batch;
DDP averages the W ranks' gradients, which leaves  sum over all tokens of grad(loss) / N : the
gradient of the global mean loss, exactly as on one process, whatever the padding. Gradients are
synchronised once per step: every micro-step but the last runs under `no_sync()`.

Only rank 0 writes (logs, metrics, plots, checkpoints). Under FSDP (`train.fsdp=true`) the
parameters, gradients and AdamW moments are sharded over the ranks; a checkpoint gathers them
into the usual full-weight format, so it resumes under DDP, FSDP or one process alike.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from sheepop.config import TrainConfig
from sheepop.data.windows import IGNORE_INDEX
from sheepop.errors import UserError

TIMEOUT_ENV = "SHEEPOP_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


class RankFailure(UserError):
    """Another rank crashed or stopped answering: this one stops too, with one clear line."""


def under_torchrun() -> bool:
    """True in a process started by torchrun (it sets RANK, LOCAL_RANK and WORLD_SIZE)."""
    return all(name in os.environ for name in TORCHRUN_ENV)


def timeout_seconds() -> float:
    """How long a collective may wait for the other ranks ($SHEEPOP_DIST_TIMEOUT, seconds)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"{TIMEOUT_ENV} must be a positive number of seconds, not '{text}'")
    return value


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of one rank's step: distinct dropout masks on each rank, and a resumed run
    replays them exactly (nothing depends on RNG state carried across steps)."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0] >> 1)


class RankSampler:
    """Rank r's rows [r*B, (r+1)*B) of the global micro-batch of W*B windows that the shared
    sampler draws; its state (`state`, `snapshot`, `set_state`) is the shared sampler's."""

    def __init__(self, sampler: Any, rank: int, world_size: int):
        self.inner, self.rank, self.rows = sampler, rank, sampler.B
        sampler.B = sampler.B * world_size  # one draw of W*B, as one process with batch W*B

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.inner.next_batch()
        mine = slice(self.rank * self.rows, (self.rank + 1) * self.rows)
        return x[mine], y[mine]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Solo:
    """One process (no torchrun): training runs as it always does."""

    rank, world_size, is_main = 0, 1, True
    wrap_engine = None

    def __init__(self, train_cfg: TrainConfig, log=print):
        self.cfg, self.log = train_cfg, log

    def shard(self, trainer: Any) -> None:
        if self.cfg.fsdp:
            self.log("note: train.fsdp applies under torchrun only; one process trains alone")


class Ranks:
    """This process's place in a torchrun job: the process group, collectives, the wrappers."""

    def __init__(self, train_cfg: TrainConfig, log=print):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.cfg = torch, dist, train_cfg
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.is_main = self.rank == 0
        self.log = log if self.is_main else _silent
        if train_cfg.engine != "torch":
            raise UserError("distributed training needs train.engine=torch (the NumPy engine "
                            "trains on one process)")
        self.device = self._device(train_cfg.device)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.timeout = timeout_seconds()
        dist.init_process_group(self.backend, timeout=datetime.timedelta(seconds=self.timeout),
                                device_id=self.device if self.device.type == "cuda" else None)

    def _device(self, name: str):
        torch = self.torch
        wants_cuda = name == "cuda" or (name == "auto" and torch.cuda.is_available())
        if name.startswith("cuda:"):
            raise UserError(f"train.device={name}: under torchrun each rank takes the GPU of its "
                            "LOCAL_RANK; use train.device=cuda (or auto)")
        if not wants_cuda:
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise UserError(f"train.device={name} but CUDA is not available here")
        if self.local_rank >= torch.cuda.device_count():
            raise UserError(f"local rank {self.local_rank} has no GPU ({torch.cuda.device_count()}"
                            " visible): start at most that many processes per machine")
        torch.cuda.set_device(self.local_rank)  # the engine's plain "cuda" now means this GPU
        return torch.device("cuda", self.local_rank)

    # Collectives: every rank calls them in the same order.
    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Turn a failed collective (a peer died or hung past the timeout) into RankFailure."""
        try:
            yield
        except Exception as e:
            if not _is_comm_failure(e):
                raise
            text = str(e).strip()
            first = text.splitlines()[0][:300] if text else type(e).__name__
            why = (f"another rank did not answer within {self.timeout:g} s ({TIMEOUT_ENV})"
                   if "timed out" in text.lower() or "timeout" in text.lower() else
                   "lost contact with another rank (it probably crashed: see its messages)")
            raise RankFailure(f"rank {self.rank} of {self.world_size}: {what} failed: {why}; "
                              f"stopping. [{first}]") from None

    def all_reduce(self, values: list[float]) -> list[float]:
        """Sums over the ranks, in float64."""
        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t)
        return t.tolist()

    def agree(self, flag: bool) -> bool:
        """Rank 0's `flag` on every rank (e.g. "out of time"), so all ranks stop together."""
        t = self.torch.tensor([1.0 if flag else 0.0], device=self.device)
        with self.guard("agreeing to stop"):
            self.dist.broadcast(t, 0)
        return bool(t.item())

    def wrap_engine(self, engine: Any) -> DistributedEngine:
        return DistributedEngine(engine, self)

    def shard(self, trainer: Any) -> None:
        """Give the trainer this rank's share of the data and the whole job's figures."""
        t, T = self.cfg, trainer.cfg.model.block_size
        trainer.sampler = RankSampler(trainer.sampler, self.rank, self.world_size)
        trainer.world_size = self.world_size
        trainer.agree = self.agree
        sequences = self.world_size * t.batch_size * t.grad_accum
        self.log(f"data parallel: {self.world_size} processes x batch {t.batch_size} x "
                 f"{t.grad_accum} micro-batches = {sequences} sequences ({sequences * T:,} "
                 "tokens) per step")

    def close(self) -> None:
        """Tear the group down together: rank 0 may still be writing its checkpoint and plots,
        and a rank that destroys its gloo group while a peer is still using it has been seen to
        abort ("terminate called without an active exception")."""
        if self.dist.is_initialized():
            with self.guard("finishing"):
                self.dist.barrier()
            self.dist.destroy_process_group()


def _silent(*args: Any, **kwargs: Any) -> None:
    """The log of ranks other than 0: they train and stay quiet."""


def _is_comm_failure(e: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        mark in text for mark in ("gloo", "NCCL", "Timed out", "Connection reset",
                                  "Connection closed", "timeout"))


@contextlib.contextmanager
def session(train_cfg: TrainConfig, log=print) -> Iterator[Solo | Ranks]:
    """The job this process belongs to: `Ranks` under torchrun (the process group is torn down at
    the end), `Solo` otherwise."""
    if not under_torchrun():
        yield Solo(train_cfg, log)
        return
    ranks = Ranks(train_cfg, log)
    yield ranks
    # Reached only on success: after a failure the process exits and torchrun cleans up (a
    # teardown waiting on a dead peer could hang).
    ranks.close()


class DistributedEngine:
    """The torch engine under DDP (replicated) or FSDP (sharded); see the module docstring."""

    def __init__(self, engine: Any, ranks: Ranks):
        import torch

        self.torch, self.engine, self.ranks = torch, engine, ranks
        self.name, self.world_size = engine.name, ranks.world_size
        self.fsdp = bool(engine.cfg.fsdp)
        self.step = 0
        if self.fsdp:
            with ranks.guard("sharding the model (FSDP)"):
                shard_engine(engine, ranks.world_size)
        else:
            from torch.nn.parallel import DistributedDataParallel

            # The only buffer (the sinusoidal table) is a constant: no syncing at each forward.
            params = inspect.signature(DistributedDataParallel.__init__).parameters
            no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in params
                              else {"broadcast_buffers": False})  # older torch
            with ranks.guard("replicating the model (DDP)"):
                ddp = DistributedDataParallel(
                    engine.model, **no_buffer_sync,
                    device_ids=[engine.device.index] if engine.device.type == "cuda" else None)
            engine.forward = torch.compile(ddp) if engine.cfg.compile else ddp
            engine.no_sync = ddp.no_sync
        engine.loss_multiplier = ranks.world_size  # DDP and FSDP average over the ranks

    @property
    def description(self) -> str:
        how = "FSDP (sharded)" if self.fsdp else "DDP"
        return (f"{self.engine.description}; {how} over {self.world_size} processes "
                f"({self.ranks.backend})")

    def num_params(self) -> int:
        return self.engine.num_params()

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr: float
                   ) -> tuple[float, float]:
        """One step of the whole job: returns the global mean loss and the gradient norm."""
        count = int(sum(int((y != IGNORE_INDEX).sum()) for _, y in micro_batches))
        with self.ranks.guard(f"step {self.step + 1}"):
            (total,) = self.ranks.all_reduce([count])
            self.torch.manual_seed(step_seed(self.engine.cfg.seed, self.step, self.ranks.rank))
            loss, norm = self.engine.train_step(micro_batches, lr, total_count=int(total))
            (loss,) = self.ranks.all_reduce([loss])  # each rank returned its sum / global N
        self.step += 1
        return loss, norm

    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(sum of token losses, count) over the whole batch. Under DDP each rank takes every
        W-th row; under FSDP every rank runs the whole batch (its forward is collective)."""
        with self.ranks.guard("evaluation"):
            if self.fsdp:
                return self.engine.eval_loss(x, y)
            mine = slice(self.ranks.rank, None, self.world_size)
            part = self.engine.eval_loss(x[mine], y[mine]) if len(x[mine]) else (0.0, 0)
            loss_sum, count = self.ranks.all_reduce([part[0], part[1]])
        return loss_sum, int(count)

    # Checkpoints: DDP's replicas are equal, rank 0's copy is the state; FSDP gathers its shards
    # (a collective, so every rank calls these and rank 0 alone keeps the result).
    def weights(self) -> dict[str, np.ndarray]:
        if not self.fsdp:
            return self.engine.weights() if self.ranks.is_main else {}
        with self.ranks.guard("gathering the weights"):
            return gather_weights(self.engine, self.ranks.is_main)

    def optimizer_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if not self.fsdp:
            return self.engine.optimizer_arrays() if self.ranks.is_main else ({}, {})
        with self.ranks.guard("gathering the optimizer state"):
            return gather_optimizer(self.engine, self.ranks.is_main)

    def load_optimizer_arrays(self, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        """Every rank loads the same full state (a checkpoint from any number of ranks)."""
        self.step = int(info.get("step", 0))
        if not self.fsdp:
            self.engine.load_optimizer_arrays(arrays, info)
            return
        scatter_optimizer(self.engine, arrays, info)


# FSDP: each transformer block is one sharded unit (gathered for its forward and backward, then
# freed); the embedding, the final LayerNorm and the head form the root unit.
def shard_engine(engine: Any, world_size: int) -> None:
    """Shard the engine's model over the ranks and rebuild its optimizer on the shards."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sheepop.train.engine_torch import decay_groups

    if engine.dtype == torch.float16:
        raise UserError("train.fsdp with train.dtype=float16 is not supported (its gradient "
                        "scaler does not know the shards): use bfloat16")
    mesh = init_device_mesh(engine.device.type, (world_size,))
    for block in engine.model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(engine.model, mesh=mesh)
    model, cfg = engine.model, engine.cfg
    engine.param_names = {p: n for n, p in model.named_parameters()}  # new (sharded) tensors
    engine.fused = False
    engine.optimizer = torch.optim.AdamW(decay_groups(model, cfg.weight_decay), lr=cfg.lr,
                                         betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    engine.forward = torch.compile(model) if cfg.compile else model

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        model.set_requires_gradient_sync(False)  # accumulate unsharded; reduce on the last
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    engine.no_sync = no_sync


def gather_weights(engine: Any, keep: bool) -> dict[str, np.ndarray]:
    """The full weights (one parameter at a time, so the peak is one full tensor)."""
    engine.model.reshard()  # an evaluation's forward leaves the root's parameters gathered
    out = {}
    for name, p in engine.model.named_parameters():
        full = p.full_tensor()
        if keep:
            out[name] = full.detach().float().cpu().numpy()
    return out


def gather_optimizer(engine: Any, keep: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The AdamW moments in the checkpoint's full format (`exp_avg.<name>`, ...)."""
    import torch

    engine.model.reshard()
    arrays, step = {}, 0
    for name, p in engine.model.named_parameters():
        state = engine.optimizer.state.get(p)
        if not state:
            continue  # before the first step
        for key in ("exp_avg", "exp_avg_sq"):
            full = state[key].full_tensor()
            if keep:
                arrays[f"{key}.{name}"] = full.float().cpu().numpy()
        step = int(state["step"])
    arrays["rng.torch"] = torch.get_rng_state().numpy()
    return (arrays, {"adam_step": step, "grad_scale": None}) if keep else ({}, {})


def scatter_optimizer(engine: Any, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> None:
    """Load full AdamW moments (every rank read the same checkpoint) as this rank's shards."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    for name, p in engine.model.named_parameters():
        if f"exp_avg.{name}" not in arrays:
            continue
        state: dict[str, Any] = {"step": torch.tensor(float(info.get("adam_step", 0)))}
        for key in ("exp_avg", "exp_avg_sq"):
            full = torch.from_numpy(arrays[f"{key}.{name}"]).to(engine.device)
            # src_data_rank=None: each rank cuts its own shard from its copy, no communication
            state[key] = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
        engine.optimizer.state[p] = state
