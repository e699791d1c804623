"""pytest plugin for run_upstream.py: selects the compiled-autograd engine and records results.

Loaded with `-p upstream_plugin` (run_upstream.py puts this folder on PYTHONPATH); it is
not a test module, so the project's `pytest test` never imports it.

Environment:
  PCA_UPSTREAM_ENGINE   "python" or "legacy": torch._dynamo.config.compiled_autograd_engine
  PCA_UPSTREAM_RAW      where to write the raw per-test results (JSON)
  PCA_UPSTREAM_ONLY     comma-separated test names: run only those (exact names)
"""

from __future__ import annotations

import json
import os
import time

import pytest

ENGINE = os.environ.get("PCA_UPSTREAM_ENGINE", "python")
RAW_PATH = os.environ.get("PCA_UPSTREAM_RAW")
# Characters of a failure's text kept per test (the JSON stays readable).
LONGREPR_CHARS = 6000

_results: dict[str, dict] = {}
# Set in pytest_configure: a pytest-xdist worker runs tests but does not record them.
_IS_XDIST_WORKER = False
_collect_errors: list[dict] = []
_start = time.monotonic()


def _select_engine() -> None:
    import torch._dynamo.config as dynamo_config

    if not hasattr(dynamo_config, "compiled_autograd_engine"):
        raise pytest.UsageError(
            "torch._dynamo.config has no compiled_autograd_engine: this is not the patched wheel"
        )
    dynamo_config.compiled_autograd_engine = ENGINE


def pytest_configure(config):
    global _IS_XDIST_WORKER
    _IS_XDIST_WORKER = hasattr(config, "workerinput")
    if ENGINE not in ("python", "legacy"):
        raise pytest.UsageError(f"PCA_UPSTREAM_ENGINE must be python or legacy, not {ENGINE!r}")
    _select_engine()


def pytest_collection_modifyitems(session, config, items):
    only = os.environ.get("PCA_UPSTREAM_ONLY")
    if not only:
        return
    names = set(only.split(","))
    keep = [item for item in items if item.name in names]
    config.hook.pytest_deselected(items=[item for item in items if item.name not in names])
    items[:] = keep


def pytest_report_header(config):
    import torch

    return [f"[upstream] torch {torch.__version__}, compiled_autograd_engine={ENGINE!r}"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # The test file only config.patch()es other keys and never touches the engine; this
    # re-selects it anyway, so that no test can leak another engine into the next one.
    _select_engine()


def _essence(report) -> str:
    """The exception line pytest reports for a failure (its 'reprcrash')."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return f"{crash.message}"
    text = str(report.longrepr or "")
    return text.strip().splitlines()[-1] if text.strip() else ""


def pytest_runtest_logreport(report):
    entry = _results.setdefault(
        report.nodeid, {"outcome": None, "duration_s": 0.0, "message": "", "longrepr": ""}
    )
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 3)
    if report.when == "call" and hasattr(report, "wasxfail"):
        # unittest.expectedFailure: pytest reports "skipped" + wasxfail when it failed as
        # expected, and "passed" + wasxfail (strict: failed) when it passed.
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.passed:
        outcome = "passed" if entry["outcome"] is None else entry["outcome"]
    elif report.skipped:
        outcome = "skipped"
        if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            entry["message"] = str(report.longrepr[2])
    else:
        outcome = "failed" if report.when == "call" else "error"
        if entry["outcome"] in ("failed", "error"):
            outcome = entry["outcome"]  # a teardown error after a failure stays a failure
        entry["message"] = entry["message"] or _essence(report)
        text = report.longreprtext
        entry["longrepr"] = (entry["longrepr"] + f"\n--- {report.when} ---\n" + text)[-LONGREPR_CHARS:]
    if entry["outcome"] not in ("failed", "error") or outcome in ("failed", "error"):
        entry["outcome"] = outcome


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append({"nodeid": report.nodeid, "longrepr": str(report.longrepr)[-LONGREPR_CHARS:]})
        _write_raw(None)


def _write_raw(exitstatus) -> None:
    """Writes the results so far (atomically): after every test, so that a run that dies
    half-way (a crash, a timeout of the whole job) still leaves the tests it ran. Under
    pytest-xdist only the controller writes: it receives every worker's reports."""
    if not RAW_PATH or _IS_XDIST_WORKER:
        return
    tmp = f"{RAW_PATH}.tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "engine": ENGINE,
                "exitstatus": exitstatus,
                "finished": exitstatus is not None,
                "wall_s": round(time.monotonic() - _start, 1),
                "collect_errors": _collect_errors,
                "tests": _results,
            },
            f,
            indent=1,
        )
    os.replace(tmp, RAW_PATH)


def pytest_runtest_logfinish(nodeid, location):
    _write_raw(None)


def pytest_sessionfinish(session, exitstatus):
    _write_raw(int(exitstatus))
