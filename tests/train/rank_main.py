"""One rank of a torchrun job for the tests: `sheepop ARGS`, optionally with a fault injected.

SHEEPOP_TEST_FAULT=KIND:RANK:STEP makes rank RANK, as it starts optimizer step STEP, either die
at once (KIND=crash: SIGKILL, as the kernel's out-of-memory killer would) or stop answering
(KIND=hang: it sleeps past every timeout). Only this helper reads the variable.
"""

import os
import signal
import sys
import time

from sheepop.cli import main
from sheepop.train import distributed_engine


def inject(kind: str, rank: int, step: int) -> None:
    train_step = distributed_engine.DistributedEngine.train_step

    def faulty(self, micro_batches, lr):
        if self.ranks.rank == rank and self.step + 1 == step:
            if kind == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            # Hung, but not deaf: torchrun's SIGTERM (once rank 0 has timed out and left) ends
            # this rank at once, instead of after torchrun's 30 s wait for SIGKILL; what the
            # test checks, rank 0's timeout and its one line, happens before either.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            time.sleep(3600)
        return train_step(self, micro_batches, lr)

    distributed_engine.DistributedEngine.train_step = faulty


if __name__ == "__main__":
    fault = os.environ.get("SHEEPOP_TEST_FAULT")
    if fault:
        kind, rank, step = fault.split(":")
        inject(kind, int(rank), int(step))
    sys.exit(main(sys.argv[1:]))
