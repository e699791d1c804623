#!/usr/bin/env python3
"""Run PyTorch's own test/inductor/test_compiled_autograd.py against the installed wheel.

Usage (make test-upstream / make test-upstream-full run this with the venv's python):
  python test/upstream/run_upstream.py [--engine python|legacy] [--subset FILE | --full]
                                       [--pytorch-tests DIR] [--workers N] [--rescore]
                                       [-- PYTEST_ARGS...]
Documentation: docs/testing-upstream.md.

- Prepares a copy of the test file in build/upstream-tests/test/inductor/ (the file under
  PYTORCH_TESTS is never modified). The file loads three sibling test files at module level
  (test/test_autograd.py, test/test_custom_ops.py, test/dynamo/test_higher_order_ops.py) to
  build wrapped test classes; where PYTORCH_TESTS does not have them, the copy gets stub
  modules that define those classes without tests, so the wrapped classes are empty.
- Runs pytest on the copy in a child process with upstream_plugin (this folder), which sets
  torch._dynamo.config.compiled_autograd_engine for the whole session and records each test
  (raw-<tag>.json, after every test); site/sitecustomize.py selects the same engine in
  Python subprocesses the tests start.
- Compares the failures with the tracked list of expected differences (for the python engine
  test/upstream/expected_differences.txt, for the legacy engine expected_failures_legacy.txt;
  one line each: `test_name  # reason`), writes build/upstream/results-<tag>.json (tag: the
  engine, plus -<subset file's stem> for a subset) and prints one summary line.

Exit status 0 only if the session finished, at least one test ran, nothing failed off the
list, no test on the list passed (a fixed difference must leave the list), and every list
entry (and subset entry) was collected. With --subset, list entries outside the subset are
not checked; with extra pytest arguments (-k ...), entries that did not run are only
mentioned.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TEST_FILE = "test/inductor/test_compiled_autograd.py"
# The upstream commit's file that README of shared/pytorch-tests describes.
KNOWN_SHA256 = "422b1880b65ec8ba7536a9e7f5015c459463c231c2b905b4146fe5c6cc88726a"

# Sibling test files the test file loads at module level, and the classes it wraps.
SIBLINGS = {
    "test/test_autograd.py": ["TestAutograd", "TestNestedCheckpoint"],
    "test/test_custom_ops.py": ["TestCustomOp"],
    "test/dynamo/test_higher_order_ops.py": [
        "HigherOrderOpTests",
        "FuncTorchHigherOrderOpTests",
        "ActivationCheckpointingTests",
    ],
}

LISTS = {
    "python": HERE / "expected_differences.txt",
    "legacy": HERE / "expected_failures_legacy.txt",
}
DEFAULT_SUBSET = HERE / "ci_subset.txt"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["python", "legacy"],
                        default=os.environ.get("ENGINE", "python"))
    parser.add_argument("--pytorch-tests", type=Path,
                        default=Path(os.environ.get("PYTORCH_TESTS", REPO.parent / "shared" / "pytorch-tests")),
                        help="checkout (or part) of pytorch holding test/inductor/test_compiled_autograd.py")
    parser.add_argument("--build-dir", type=Path, default=REPO / "build" / "upstream-tests")
    parser.add_argument("--out-dir", type=Path, default=REPO / "build" / "upstream")
    parser.add_argument("--expected", type=Path, help="list of expected failures (default by engine)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--subset", type=Path,
                       help=f"run only the tests named in this file (e.g. {DEFAULT_SUBSET.relative_to(REPO)})")
    group.add_argument("--full", action="store_true", help="run the whole file (the default without --subset)")
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds per test (pytest-timeout, when installed); 0: none")
    parser.add_argument("--workers", type=int, default=0,
                        help="pytest processes (pytest-xdist, when installed); 0: the tests run in "
                             "pytest's own process")
    parser.add_argument("--rescore", action="store_true",
                        help="run nothing: compare the raw results of the last run (raw-<engine>.json "
                             "in --out-dir) with the list again, e.g. after editing it")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    return parser.parse_args(argv)


def read_list(path: Path) -> dict[str, str]:
    """`test_name  # reason` lines (blank lines and lines starting with # ignored)."""
    entries: dict[str, str] = {}
    if not path.exists():
        return entries
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, reason = line.partition("#")
        name = name.strip()
        if not name or " " in name or not reason.strip():
            raise SystemExit(f"{path}:{lineno}: expected `test_name  # reason`, got {line!r}")
        if name in entries:
            raise SystemExit(f"{path}:{lineno}: {name} listed twice")
        entries[name] = reason.strip()
    return entries


def read_subset(path: Path) -> set[str]:
    """Test names, one a line; `#` starts a comment, blank lines are ignored."""
    names: set[str] = set()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        name = line.partition("#")[0].strip()
        if not name:
            continue
        if " " in name:
            raise SystemExit(f"{path}:{lineno}: expected one test name, got {line!r}")
        names.add(name)
    if not names:
        raise SystemExit(f"{path}: no test names")
    return names


def prepare(src_root: Path, build_dir: Path) -> Path:
    """Copy the test file (and the siblings that exist, else stubs) into build_dir."""
    src = src_root / TEST_FILE
    if not src.is_file():
        raise SystemExit(f"[upstream] {src} not found: set PYTORCH_TESTS (see ../shared/pytorch-tests/README.md)")
    if build_dir.exists():
        shutil.rmtree(build_dir)
    dst = build_dir / TEST_FILE
    dst.parent.mkdir(parents=True)
    data = src.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != KNOWN_SHA256:
        print(f"[upstream] note: {src} differs from the known upstream file (sha256 {digest[:12]}...)")
    dst.write_bytes(data)
    for rel, classes in SIBLINGS.items():
        target = build_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (src_root / rel).is_file():
            shutil.copyfile(src_root / rel, target)
            continue
        body = "".join(f"\n\nclass {c}(unittest.TestCase):\n    pass\n" for c in classes)
        target.write_text(
            f'"""Stub written by test/upstream/run_upstream.py: {rel} is not in the seed.\n\n'
            "test_compiled_autograd.py wraps these classes; without tests they add none.\n"
            '"""\n\nimport unittest\n' + body
        )
    # Own ini file: pytest uses build_dir as rootdir and reads no project configuration.
    (build_dir / "pytest.ini").write_text("[pytest]\naddopts =\n")
    return dst


def test_name(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[-1]


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    engine = args.engine
    # The child pytest runs in build_dir: every path handed to it must be absolute.
    args.build_dir = args.build_dir.resolve()
    args.out_dir = args.out_dir.resolve()
    expected_path = (args.expected or LISTS[engine]).resolve()
    expected = read_list(expected_path)
    subset = read_subset(args.subset) if args.subset else None
    # A subset run writes its own files (results-python-ci_subset.json), next to the full run's.
    tag = engine + (f"-{args.subset.stem}" if args.subset else "")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = args.out_dir / f"raw-{tag}.json"
    log_path = args.out_dir / f"pytest-{tag}.log"
    if args.rescore:
        if not raw_path.exists():
            raise SystemExit(f"[upstream] --rescore: {raw_path} does not exist")
        raw = json.loads(raw_path.read_text())
        return report(args, engine, tag, expected_path, expected, subset, raw,
                      raw.get("exitstatus"), raw.get("runner_wall_s", raw.get("wall_s", 0.0)))
    test_path = prepare(args.pytorch_tests.resolve(), args.build_dir)
    raw_path.unlink(missing_ok=True)

    cmd = [sys.executable, "-m", "pytest", str(test_path),
           "-c", str(args.build_dir.resolve() / "pytest.ini"),
           "--rootdir", str(args.build_dir.resolve()),
           "-p", "upstream_plugin", "-p", "no:cacheprovider",
           "-q", "-rfEX", "--tb=short"]
    if args.timeout:
        probe = subprocess.run([sys.executable, "-c", "import pytest_timeout"], capture_output=True)
        if probe.returncode == 0:
            cmd += [f"--timeout={args.timeout}"]
        else:
            print("[upstream] pytest-timeout is not installed: no per-test timeout")
    if args.workers:
        probe = subprocess.run([sys.executable, "-c", "import xdist"], capture_output=True)
        if probe.returncode == 0:
            cmd += ["-n", str(args.workers)]
        else:
            print("[upstream] pytest-xdist is not installed: the tests run in one process")
    cmd += args.pytest_args

    env = dict(os.environ)
    env["PCA_UPSTREAM_ENGINE"] = engine
    env["PCA_UPSTREAM_RAW"] = str(raw_path)
    if subset is not None:
        env["PCA_UPSTREAM_ONLY"] = ",".join(sorted(subset))
    # upstream_plugin, and site/sitecustomize.py: subprocesses the tests start
    # (run_as_subprocess) select the same engine.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(HERE / "site")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")

    print(f"[upstream] engine={engine}: {' '.join(cmd)}", flush=True)
    print(f"[upstream] pytest output: {log_path}", flush=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=args.build_dir.resolve(), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if os.environ.get("PCA_UPSTREAM_VERBOSE"):
                sys.stdout.write(line)
        proc.wait()
    wall = time.monotonic() - start

    if not raw_path.exists():
        print(f"[upstream] pytest exited {proc.returncode} without results; tail of {log_path}:")
        print("".join(log_path.read_text().splitlines(True)[-40:]))
        return 1
    raw = json.loads(raw_path.read_text())
    raw["runner_wall_s"] = round(wall, 1)
    raw["pytest_args"] = args.pytest_args
    raw_path.write_text(json.dumps(raw, indent=1))
    if not raw.get("finished"):
        print(f"[upstream] pytest exited {proc.returncode} before the end of the session "
              f"(results of the tests it ran follow); tail of {log_path}:")
        print("".join(log_path.read_text().splitlines(True)[-20:]))
    return report(args, engine, tag, expected_path, expected, subset, raw, proc.returncode, wall)


def report(args, engine, tag, expected_path, expected, subset, raw, pytest_exit, wall) -> int:
    """Compares the raw results with the list; writes results-<tag>.json; prints the summary."""
    tests = raw["tests"]

    counts = {k: 0 for k in ("passed", "failed", "skipped", "xfailed", "xpassed",
                             "expected_difference")}
    unexpected_failures, now_passing, rows = [], [], {}
    names_seen = set()
    for nodeid, r in sorted(tests.items()):
        name = test_name(nodeid)
        if name in names_seen:
            # The lists name tests without their class: two classes with one test name
            # would share an entry.
            print(f"[upstream] note: test name {name} is collected more than once")
        names_seen.add(name)
        outcome = r["outcome"]
        listed = name in expected
        status = outcome
        if outcome in ("failed", "error"):
            if listed:
                status = "expected_difference"
            else:
                status = "failed"
                unexpected_failures.append(name)
        elif outcome == "passed" and listed:
            now_passing.append(name)
        counts[status if status in counts else "failed"] += 1
        rows[nodeid] = {
            "status": status,
            "outcome": outcome,
            "duration_s": r["duration_s"],
            **({"listed_reason": expected[name]} if listed else {}),
            **({"message": r["message"]} if r["message"] else {}),
            **({"longrepr": r["longrepr"]} if r["longrepr"] else {}),
        }

    # Entries for tests that were not run at all (renamed upstream, or outside the subset).
    # Only a run of the whole file (or of the subset) can tell: with extra pytest arguments
    # (-k ...) they are only mentioned.
    stale = sorted(n for n in expected if n not in names_seen)
    if subset is not None:
        stale = [n for n in stale if n in subset]
    pytest_args = raw.get("pytest_args", args.pytest_args)
    selective = bool(pytest_args)
    # Subset entries that name no collected test (renamed or removed upstream).
    subset_not_run = sorted(subset - names_seen) if subset is not None and not selective else []
    result = {
        "engine": engine,
        "test_file": str(args.pytorch_tests / TEST_FILE),
        "subset": str(args.subset) if args.subset else None,
        "expected_list": str(expected_path),
        "pytest_args": pytest_args,
        "pytest_exit": pytest_exit,
        "finished": bool(raw.get("finished")),
        "wall_s": round(wall, 1),
        "counts": counts,
        "collect_errors": raw["collect_errors"],
        "unexpected_failures": unexpected_failures,
        "listed_but_passing": now_passing,
        "listed_but_not_run": stale,
        "subset_not_run": subset_not_run,
        "tests": rows,
    }
    out_path = args.out_dir / f"results-{tag}.json"
    out_path.write_text(json.dumps(result, indent=1) + "\n")

    total = len(rows)
    summary = (
        f"[upstream] engine={engine}: {total} tests: {counts['passed']} passed, "
        f"{counts['failed']} failed, {counts['skipped']} skipped, {counts['xfailed']} xfail, "
        f"{counts['xpassed']} xpass, {counts['expected_difference']} expected-differences "
        f"in {wall:.0f} s ({out_path.relative_to(REPO) if out_path.is_relative_to(REPO) else out_path})"
    )
    ok = True
    for err in raw["collect_errors"]:
        print(f"[upstream] collection error in {err['nodeid']}:\n{err['longrepr']}")
        ok = False
    for name in unexpected_failures:
        nodeid = next(n for n in rows if test_name(n) == name)
        first_line = (rows[nodeid].get("message", "").strip().splitlines() or [""])[0]
        print(f"[upstream] FAILED (not in {expected_path.name}): {name}: {first_line[:200]}")
        ok = False
    for name in now_passing:
        print(f"[upstream] PASSES but is listed in {expected_path.name}: {name}: remove it from the list")
        ok = False
    for name in stale:
        print(f"[upstream] listed in {expected_path.name} but not run: {name}")
        ok = ok and selective
    for name in subset_not_run:
        print(f"[upstream] named in {args.subset.name} but not collected: {name}")
        ok = False
    if not raw.get("finished"):
        print("[upstream] the pytest session did not finish")
        ok = False
    if total == 0:
        print("[upstream] no test ran")
        ok = False
    if counts["xpassed"]:
        # upstream's expectedFailure tests that pass (pytest fails them too)
        print(f"[upstream] {counts['xpassed']} unexpected success(es) of upstream expectedFailure tests")
        ok = False
    print(summary)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
