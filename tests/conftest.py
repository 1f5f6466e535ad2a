"""Shared test set-up: pinned torch threads (bitwise-stable references) and the `gpu` marker."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

import omni.models.registry  # noqa: F401  omni's families' stage kinds, as omnid has them (tests build their graphs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; never run in CI")
    config.addinivalue_line("markers", "slow: longer end-to-end test")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def exact_cuda():
    """float32 matmuls and convolutions on CUDA without TF32, for comparisons with the CPU."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.fixture(scope="module")
def loop():
    """An event loop on its own thread for a module's in-process kernels (qwen3_fixtures.RunningKernel)."""
    from qwen3_fixtures import LoopThread

    thread = LoopThread()
    yield thread
    thread.close()
