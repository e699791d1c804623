"""Shared fixtures: every test starts from a clean compiled-autograd state."""

import os
import pathlib

import pytest
import torch
from hypothesis import HealthCheck, settings
from torch._dynamo.utils import counters


# Property tests (test_random_graphs.py, test_index_simplification.py): `make test`
# runs 200 examples each, `make fuzz` 2,000.
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("PCA_HYPOTHESIS_PROFILE", "ci"))

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
