import pytest

from sheepop.config import ModelConfig


@pytest.fixture
def small_cfg() -> ModelConfig:
    return ModelConfig(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
