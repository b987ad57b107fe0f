"""The torch engine on every rank of a torchrun job: DistributedDataParallel or FSDP.

The gradient. With N the counted (non-padding) targets of the whole step on all ranks
(all-reduced), rank r back-propagates  W * (sum of its token losses) / N  for each micro-batch;
DDP averages the W ranks' gradients, which leaves  sum over all tokens of grad(loss) / N : the
gradient of the global mean loss, exactly as on one process, whatever the padding. Gradients are
synchronised once per step: every micro-step but the last runs under `no_sync()`.

Under FSDP (`train.fsdp=true`) the parameters, gradients and AdamW moments are sharded over the
ranks; a checkpoint gathers them into the usual full-weight format, so it resumes under DDP,
FSDP or one process alike. The job itself (process group, collectives, failures) is
`sheepop.train.distributed.Ranks`, passed in as `ranks`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.errors import UserError
from sheepop.model import compiler


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of one rank's step: distinct dropout masks on each rank, and a resumed run
    replays them exactly (nothing depends on RNG state carried across steps)."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, np.uint64)[0] >> 1)


class DistributedEngine:
    """The torch engine under DDP (replicated) or FSDP (sharded); see the module docstring."""

    def __init__(self, engine: Any, ranks: Any):
        """`ranks`: this process's `distributed.Ranks` (rank, world size, collectives)."""
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
            engine.forward = compiler.compile(ddp) if engine.cfg.compile else ddp
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

    if engine.dtype == torch.float16:
        raise UserError("train.fsdp with train.dtype=float16 is not supported (its gradient "
                        "scaler does not know the shards): use bfloat16")
    mesh = init_device_mesh(engine.device.type, (world_size,))
    for block in engine.model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(engine.model, mesh=mesh)
    model = engine.model
    engine.param_names = {p: n for n, p in model.named_parameters()}  # new (sharded) tensors
    engine.fused = False
    engine.build_optimizers()  # AdamW only: Config.validate refuses Muon with FSDP
    engine.forward = compiler.compile(model) if engine.cfg.compile else model

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
