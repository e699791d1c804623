"""Selects the compiled-autograd engine in Python subprocesses that upstream tests start.

run_upstream.py puts this folder on PYTHONPATH together with PCA_UPSTREAM_ENGINE, so that a
test that runs a script with `python -c` (run_as_subprocess, e.g. test_dynamo_flaky_segfault)
uses the same engine as the test process. It imports nothing eagerly: it sets
torch._dynamo.config.compiled_autograd_engine right after that module is first imported.
Without PCA_UPSTREAM_ENGINE it does nothing. It shadows the interpreter's own
sitecustomize (on Debian, only an optional apport crash hook), which these runs do not need.
"""

import os
import sys

_ENGINE = os.environ.get("PCA_UPSTREAM_ENGINE")
_MODULE = "torch._dynamo.config"


class _SelectEngineFinder:
    """Meta path finder that wraps the loader of torch._dynamo.config, once."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(cls)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_select(module):
            exec_module(module)
            if hasattr(module, "compiled_autograd_engine"):
                module.compiled_autograd_engine = _ENGINE

        spec.loader.exec_module = exec_and_select
        return spec


if _ENGINE in ("python", "legacy"):
    sys.meta_path.insert(0, _SelectEngineFinder)
