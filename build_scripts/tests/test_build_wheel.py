"""The whole build (without C++) on a synthetic base wheel: outputs and incrementality."""

import difflib
import tempfile
import unittest
import zipfile
from pathlib import Path

import build_wheel
import overlay
import verify_wheel
from common import BuildError
from tests.helpers import DEFAULT_FILES, make_wheel

CA = "torch/_dynamo/compiled_autograd.py"


class BuildTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.base = make_wheel(self.dir)
        self.patches = self.dir / "patches"
        self.overlay = self.dir / "overlay"
        self.dist = self.dir / "dist"
        self.patches.mkdir()
        (self.overlay / "torch").mkdir(parents=True)
        self.args = build_wheel.parse_args([
            "--base-wheel", str(self.base), "--patches-dir", str(self.patches),
            "--overlay-dir", str(self.overlay), "--build-dir", str(self.dir / "build"),
            "--dist-dir", str(self.dist),
        ])

    def tearDown(self):
        self.tmp.cleanup()

    def test_build_is_incremental_and_complete(self):
        old = DEFAULT_FILES[CA]
        (self.patches / "0001.patch").write_text("".join(difflib.unified_diff(
            old.decode().splitlines(True), (old + b"# patched\n").decode().splitlines(True), f"a/{CA}", f"b/{CA}")))
        (self.overlay / "torch/_compiled_autograd.py").write_text("x = 1\n")
        (self.dist).mkdir()
        (self.dist / "torch-2.13.0+pyca0-old.whl").write_text("stale")

        wheel = build_wheel.build(self.args)
        self.assertEqual([p.name for p in self.dist.iterdir()], [wheel.name])
        self.assertTrue(wheel.name.startswith(build_wheel.patchset_version().join(["torch-", "-"])))
        self.assertEqual(verify_wheel.verify(wheel), [])
        with zipfile.ZipFile(wheel) as zf:
            self.assertEqual(zf.read(CA), old + b"# patched\n")
            self.assertEqual(zf.read("torch/_compiled_autograd.py"), b"x = 1\n")

        mtime = wheel.stat().st_mtime_ns
        self.assertEqual(build_wheel.build(self.args), wheel)
        self.assertEqual(wheel.stat().st_mtime_ns, mtime, "a no-op build rewrote the wheel")

        (self.overlay / "torch/_compiled_autograd.py").write_text("x = 2\n")
        build_wheel.build(self.args)
        with zipfile.ZipFile(wheel) as zf:
            self.assertEqual(zf.read("torch/_compiled_autograd.py"), b"x = 2\n")

    def test_overlay_and_patch_may_not_write_the_same_file(self):
        old = DEFAULT_FILES[CA]
        (self.patches / "0001.patch").write_text("".join(difflib.unified_diff(
            old.decode().splitlines(True), ["x\n"], f"a/{CA}", f"b/{CA}")))
        (self.overlay / CA).parent.mkdir(parents=True)
        (self.overlay / CA).write_text("y\n")
        with self.assertRaisesRegex(BuildError, "both write"):
            build_wheel.build(self.args)

    def test_overlay_files_outside_packages_are_refused(self):
        (self.overlay / "README.md").write_text("hi")
        with self.assertRaisesRegex(BuildError, "outside the wheel's packages"):
            build_wheel.build(self.args)

    def test_cxx_sources_are_not_shipped(self):
        csrc = self.overlay / "torch/csrc/x"
        csrc.mkdir(parents=True)
        (csrc / "a.h").write_text("")
        (csrc / "notes.txt").write_text("shipped")
        scanned = overlay.scan(self.overlay, frozenset({"torch"}))
        self.assertEqual(set(scanned.data_files), {"torch/csrc/x/notes.txt"})


if __name__ == "__main__":
    unittest.main()
