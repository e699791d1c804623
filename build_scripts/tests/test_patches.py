"""Applying the patch series to pristine copies of base files."""

import difflib
import tempfile
import unittest
from pathlib import Path

import patches
from common import BuildError
from tests.helpers import DEFAULT_FILES, make_wheel

PACKAGES = frozenset({"torch", "functorch"})
CA = "torch/_dynamo/compiled_autograd.py"


def diff(path: str, old: bytes | None, new: bytes | None) -> str:
    """A -p1 unified diff as `diff -u` or `git diff` would write it (/dev/null for add/delete)."""
    return "".join(difflib.unified_diff(
        (old or b"").decode().splitlines(True), (new or b"").decode().splitlines(True),
        f"a/{path}" if old is not None else "/dev/null", f"b/{path}" if new is not None else "/dev/null",
    ))


class TouchedPathsTest(unittest.TestCase):
    def test_unified_and_git_headers(self):
        text = (
            "diff --git a/torch/x.py b/torch/y.py\nsimilarity index 90%\n"
            "rename from torch/x.py\nrename to torch/y.py\n"
            "diff --git a/torch/m.py b/torch/m.py\nold mode 100644\nnew mode 100755\n"
            + diff("torch/new.py", None, b"a\n") + diff("torch/gone.py", b"a\n", None)
        )
        self.assertEqual(patches.touched_paths(text),
                         {"torch/x.py", "torch/y.py", "torch/m.py", "torch/new.py", "torch/gone.py"})

    def test_hunk_lines_that_look_like_headers_are_skipped(self):
        old = b"keep\n-- not a header\n++ nor this\nkeep\n"
        new = b"keep\nkeep\n"
        text = diff("torch/a.py", old, new)
        self.assertIn("--- not a header", text)
        self.assertEqual(patches.touched_paths(text), {"torch/a.py"})

    def test_path_without_prefix_is_rejected(self):
        with self.assertRaisesRegex(BuildError, "-p1"):
            patches.touched_paths("--- x.py\n+++ x.py\n@@ -1 +1 @@\n-a\n+b\n")


class ApplySeriesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.wheel = make_wheel(self.dir)
        self.patch_dir = self.dir / "patches"
        self.patch_dir.mkdir()

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name: str, text: str) -> Path:
        path = self.patch_dir / name
        path.write_text(text)
        return path

    def apply(self):
        return patches.apply_series(patches.list_patches(self.patch_dir), self.wheel, PACKAGES, self.dir / "work")

    def test_no_patches(self):
        self.assertEqual(self.apply(), {})

    def test_modify_create_delete(self):
        modified = DEFAULT_FILES[CA].replace(b"line 3\n", b"line 3\n# patched\n")
        self.write("0001-series.patch", diff(CA, DEFAULT_FILES[CA], modified)
                   + diff("torch/added.py", None, b"x = 1\n") + diff("torch/old.py", DEFAULT_FILES["torch/old.py"], None))
        changes = self.apply()
        self.assertEqual(changes[CA].data, modified)
        self.assertEqual(changes["torch/added.py"].data, b"x = 1\n")
        self.assertIsNone(changes["torch/old.py"].data)
        self.assertEqual(set(changes), {CA, "torch/added.py", "torch/old.py"})

    def test_rebuild_starts_from_pristine_files(self):
        self.write("0001-a.patch", diff(CA, DEFAULT_FILES[CA], DEFAULT_FILES[CA] + b"tail\n"))
        first = self.apply()
        self.assertEqual(self.apply(), first)  # applying again would fail if the copy were reused

    def test_stacked_patches_apply_with_offsets(self):
        top = b"# header 1\n# header 2\n" + DEFAULT_FILES[CA]
        self.write("0001-top.patch", diff(CA, DEFAULT_FILES[CA], top))
        # Written against pristine torch: its hunk now sits 2 lines lower.
        self.write("0002-bottom.patch", diff(CA, DEFAULT_FILES[CA], DEFAULT_FILES[CA].replace(b"line 15\n", b"line fifteen\n")))
        self.assertEqual(self.apply()[CA].data, top.replace(b"line 15\n", b"line fifteen\n"))

    def test_failure_names_the_patch_and_file(self):
        self.write("0001-ok.patch", diff(CA, DEFAULT_FILES[CA], DEFAULT_FILES[CA] + b"tail\n"))
        wrong_base = DEFAULT_FILES[CA].replace(b"line 2\n", b"line two\n")
        self.write("0002-bad.patch", diff(CA, wrong_base, wrong_base.replace(b"line 3\n", b"line III\n")))
        with self.assertRaises(BuildError) as caught:
            self.apply()
        message = str(caught.exception)
        self.assertIn("0002-bad.patch does not apply cleanly", message)
        self.assertIn(f"patching file {CA}", message)
        self.assertIn("FAILED", message)

    def test_patch_applied_twice_fails(self):
        text = diff(CA, DEFAULT_FILES[CA], DEFAULT_FILES[CA] + b"tail\n")
        self.write("0001-a.patch", text)
        self.write("0002-a-again.patch", text)
        with self.assertRaisesRegex(BuildError, "0002-a-again.patch"):
            self.apply()

    def test_missing_target_fails(self):
        self.write("0001.patch", diff("torch/nope.py", b"a\n", b"b\n"))
        with self.assertRaisesRegex(BuildError, "0001.patch does not apply"):
            self.apply()

    def test_files_outside_the_packages_are_refused(self):
        self.write("0001.patch", diff("test/test_x.py", None, b"a\n"))
        with self.assertRaisesRegex(BuildError, "test/test_x.py, outside the wheel's packages"):
            self.apply()


if __name__ == "__main__":
    unittest.main()
