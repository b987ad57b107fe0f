"""Training on several processes under torchrun: the job, its process group and its ranks.

torchrun starts one process ("rank") per device and gives each RANK, LOCAL_RANK and WORLD_SIZE;
`session()` joins them into a process group (gloo on CPU, NCCL on CUDA) with a timeout, so a
rank that crashes or hangs stops the job with an error instead of a silent wait.

The data. Every rank runs the same window sampler (same seed, same state) and draws the *global*
micro-batch of W * B windows (W ranks, B = train.batch_size per rank); rank r keeps rows
[r*B, (r+1)*B). So W processes with batch B train on exactly the windows of one process with
batch W*B, and the sampler's state, which is the same on every rank, is the whole job's position
in the data: a checkpoint resumes on any number of ranks (with W'*B' = W*B it continues the
same batches).

The model. `Ranks.wrap_engine` hands the torch engine to `distributed_engine.DistributedEngine`
(DDP or FSDP: how the gradient of the global mean loss is formed, sharding, gathering a
checkpoint). This module is the job around it: joining, collectives, failures, teardown.

Only rank 0 writes (logs, metrics, plots, checkpoints).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import numpy as np

from sheepop.config.schema import TrainConfig
from sheepop.errors import UserError
from sheepop.train.distributed_engine import DistributedEngine

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

    @staticmethod
    def leave(status: int) -> int:
        """One process ends as any Python program does: the caller returns `status`."""
        return status


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
        """True on every rank when `flag` is true on any ("out of time", "a signal came"), so
        all ranks stop at the same step. Any, not rank 0's: a signal may reach one rank only
        (`kill` of one process), or the ranks a step apart; each rank records it until the
        next step boundary, where this all-reduce (max) makes one decision for all."""
        t = self.torch.tensor([1.0 if flag else 0.0], device=self.device)
        with self.guard("agreeing to stop"):
            self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
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
        """Tear the group down together (a barrier first: rank 0 may still be saving)."""
        if self.dist.is_initialized():
            with self.guard("finishing"):
                self.dist.barrier()
            self.dist.destroy_process_group()

    @staticmethod
    def leave(status: int) -> NoReturn:
        """End this rank's process now, once its work is written: flush, then `os._exit`.

        Why not return and let Python exit: DistributedDataParallel keeps the gloo process
        group alive after `destroy_process_group` (its C++ threads, gloo_tcp_loop and two
        pt_gloo_runloop, are still running when the rank exits; /proc/PID/task shows them), so
        they run on through the interpreter's finalization and the C++ runtime's exit-time
        destructors, while the peer, exiting at the same moment, closes its sockets (which
        wakes the TCP loop). A C++ thread caught running in that teardown ends the process
        with std::terminate ("terminate called without an active exception", SIGABRT): rarely,
        more often on a loaded machine. `os._exit` skips that teardown; nothing is lost by it:
        every file (checkpoint, metrics, plots) is written and closed before, and stdout and
        stderr are flushed here.
        """
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


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
