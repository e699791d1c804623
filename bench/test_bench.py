"""Self-test of the benchmark harness (not part of `make test`; run with
`.venv/bin/python -m pytest bench -q`, ~20 s). It checks that a small run
produces complete, well-formed results. It never asserts on a time."""

import dataclasses
import json
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench  # noqa: E402
import report  # noqa: E402
from workloads import MODELS, ElementwiseChain, count_autograd_nodes  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "results"
    assert bench.main(["--backend", "eager", "--models", "mlp", "--reps", "3", "--out", str(out)]) == 0
    return json.loads(out.with_suffix(".json").read_text()) | {"markdown": out.with_suffix(".md").read_text()}


def test_every_engine_measured(results: dict) -> None:
    (model,) = results["models"]
    assert model["name"] == "mlp" and model["autograd_nodes"] > 0
    assert set(model["engines"]) == set(bench.ENGINES)
    for engine in model["engines"].values():
        if engine["error"]:  # a failing engine is reported, not hidden
            assert engine["error"] in results["markdown"]
            continue
        assert len(engine["steady_s"]) == 3 and engine["steady_median_s"] is not None
        assert engine["peak_bytes"] is not None
        if engine["engine"] != "eager":
            assert engine["first_captures"] >= 1 and engine["fx_nodes"]
            assert engine["capture_s"] is not None and engine["steady_captures"] == 0
            assert engine["grad_max_abs_diff"] == 0.0  # backend eager: same kernels as eager


def test_dynamic_sequence_recorded(results: dict) -> None:
    (model,) = results["models"]
    for run in model["dynamic"].values():
        assert run["error"] or [s["batch"] for s in run["steps"]] == [4, 5, 6, 7, 8]
        assert run["error"] or len(run["after_s"]) == len(run["after_eager_s"]) == bench.AFTER_SHAPES_REPS


def test_markdown_has_every_table(results: dict) -> None:
    markdown = results["markdown"]
    for heading in (
        "## The issue's targets", "## Per model and engine", "## Dynamic shapes", "## Where the benchmark's time went"
    ):
        assert heading in markdown
    assert markdown == report.render_markdown({k: v for k, v in results.items() if k != "markdown"})


def test_summary_reads_the_targets_off_the_per_model_numbers(results: dict) -> None:
    (model,) = results["models"]
    rows = {row[0]: row for row in report.summary_table(results["models"])}
    assert set(rows) == set(bench.ENGINES) - {"eager"}
    for name, row in rows.items():
        engine = model["engines"][name]
        if engine["steady_ratio"] is not None:
            assert row[1] == f"{engine['steady_ratio']:.2f}x over 1 model"
            assert row[2] == f"{engine['steady_ratio']:.2f}x (mlp)"
        run = model["dynamic"][name]
        if not run["error"]:
            captures = sum(s["captures"] for s in run["steps"])
            compiles = sum(s["dynamo_compiles"] for s in run["steps"])
            assert row[-1] == f"{captures} / {compiles} (mlp)"


def test_failure_is_recorded_not_raised(tmp_path: pathlib.Path) -> None:
    def broken() -> torch.nn.Module:
        raise RuntimeError("cannot build")

    result = bench.bench_model(dataclasses.replace(MODELS["mlp"], build=broken), "eager", 1, tmp_path)
    assert result.error == "RuntimeError: cannot build"


def test_autograd_node_count() -> None:
    loss = ElementwiseChain()().sum()
    assert count_autograd_nodes(loss) == 22  # 20 ops, sum, AccumulateGrad


def test_cpp_wrapper_needs_inductor() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--cpp-wrapper", "--backend", "eager"])
    assert bench.parse_args(["--cpp-wrapper"]).cpp_wrapper
