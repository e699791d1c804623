"""Finding and checking the base wheel."""

import tempfile
import unittest
from pathlib import Path

import base_wheel
from common import BuildError
from tests.helpers import make_wheel


class WheelFilenameTest(unittest.TestCase):
    def test_five_and_six_part_names(self):
        name = base_wheel.parse_wheel_filename("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
        self.assertEqual((name.distribution, name.version, name.build_tag), ("torch", "2.13.0+cpu", None))
        self.assertEqual(name.tags, "cp311-cp311-manylinux_2_28_x86_64")
        name = base_wheel.parse_wheel_filename("torch-2.13.0-1-cp311-cp311-linux_x86_64.whl")
        self.assertEqual((name.build_tag, name.python_tag), ("1", "cp311"))

    def test_rejects_non_wheels(self):
        for bad in ("torch-2.13.0.tar.gz", "torch-2.13.0-cp311.whl"):
            with self.assertRaises(BuildError):
                base_wheel.parse_wheel_filename(bad)


class ValidateTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def test_accepts_any_local_label_of_2_13_0(self):
        for version in ("2.13.0+cpu", "2.13.0", "2.13.0+cu128"):
            path = make_wheel(self.dir, version=version)
            base = base_wheel.open_and_validate(path, "hash")
            self.assertEqual(base.version, version)
            self.assertEqual(base.dist_info, f"torch-{version}.dist-info")
            self.assertEqual(base.packages, {"torch", "functorch"})

    def test_refuses_other_version_in_metadata(self):
        path = make_wheel(self.dir, version="2.14.1", filename_version="2.13.0+cpu")
        with self.assertRaisesRegex(BuildError, r"torch 2\.14\.1 \(according to its METADATA\).*TORCH_BASE_WHEEL"):
            base_wheel.open_and_validate(path, "hash")

    def test_refuses_other_version_in_filename(self):
        path = make_wheel(self.dir, version="2.13.0+cpu", filename_version="2.14.1")
        with self.assertRaisesRegex(BuildError, r"2\.14\.1 \(according to its filename\)"):
            base_wheel.open_and_validate(path, "hash")

    def test_refuses_other_python(self):
        name = base_wheel.parse_wheel_filename("torch-2.13.0-cp39-cp39-linux_x86_64.whl")
        with self.assertRaisesRegex(BuildError, "for cp39, but the build runs Python"):
            base_wheel.check_build_python(name)

    def test_locate(self):
        with self.assertRaisesRegex(BuildError, "does not exist"):
            base_wheel.locate(self.dir, str(self.dir / "missing.whl"))
        make_wheel(self.dir, version="2.13.0+cpu")
        found = base_wheel.locate(self.dir, None)
        self.assertEqual(found.name, make_wheel(self.dir, version="2.13.0+cpu").name)
        make_wheel(self.dir, version="2.13.0")
        with self.assertRaisesRegex(BuildError, "exactly one torch wheel"):
            base_wheel.locate(self.dir, None)

    def test_hash_is_cached_by_stat(self):
        path = make_wheel(self.dir)
        cache = self.dir / "cache.json"
        first = base_wheel.cached_sha256(path, cache)
        self.assertEqual(base_wheel.cached_sha256(path, cache), first)
        self.assertTrue(cache.exists())


if __name__ == "__main__":
    unittest.main()
