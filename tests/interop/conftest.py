import pytest


@pytest.fixture(autouse=True)
def torch_on_one_thread(one_torch_thread):
    """Every test here runs torch on one thread (why: tests/conftest.py, `one_torch_thread`)."""
