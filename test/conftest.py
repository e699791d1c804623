"""Shared fixtures: every test starts from a clean compiled-autograd state."""

import os
import pathlib

import pytest
import torch
from torch._dynamo.utils import counters


SHARED = pathlib.Path(
    os.environ.get("PCA_SHARED", pathlib.Path(__file__).resolve().parents[2] / "shared")
)


@pytest.fixture(scope="session")
def cpp_extension(tmp_path_factory):
    """test/cpp/test_extension.cpp, built once per session (~40 s)."""
    from torch.utils import cpp_extension

    return cpp_extension.load(
        name="pca_test_extension",
        sources=[str(pathlib.Path(__file__).parent / "cpp" / "test_extension.cpp")],
        build_directory=str(tmp_path_factory.mktemp("cpp_extension")),
    )


@pytest.fixture(autouse=True)
def fresh_compiled_autograd():
    """Forgets captured graphs, Dynamo caches and counters around each test."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.compiled_autograd_engine = "python"
    torch._dynamo.config.compiled_autograd_symbolic_sizes = False
