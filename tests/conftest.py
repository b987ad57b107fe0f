"""Fixtures shared by the test folders."""

import pytest


def _interrupt_after(trainer, n_steps: int) -> None:
    """Make the trainer's engine raise KeyboardInterrupt (as Ctrl-C does) when step
    n_steps + 1 starts."""
    real_step, done = trainer.engine.train_step, []

    def step(micro, lr):
        if len(done) == n_steps:
            raise KeyboardInterrupt
        done.append(lr)
        return real_step(micro, lr)

    trainer.engine.train_step = step


@pytest.fixture
def interrupt_after():
    return _interrupt_after
