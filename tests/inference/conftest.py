import pytest
import torch

from sheepop.config import ModelConfig
from sheepop.model import GPT, TorchLM


@pytest.fixture(autouse=True)
def one_torch_thread():
    # These models are tiny: a second thread only adds synchronisation, and on a machine shared
    # with other busy processes a spinning second thread made each step ~20x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def small_cfg() -> ModelConfig:
    return ModelConfig(vocab_size=37, block_size=32, n_layer=2, n_head=4, n_embd=32, dropout=0.0)


@pytest.fixture
def small_lm(small_cfg) -> TorchLM:
    torch.manual_seed(0)
    return TorchLM(GPT(small_cfg))
