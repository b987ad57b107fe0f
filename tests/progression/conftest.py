import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def keep_torch_threads():
    """The progression preset trains on one thread (torch.set_num_threads is process-wide):
    give the rest of the test session back the thread count it had."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
