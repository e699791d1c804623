"""Writing the output wheel: versions, dist-info rename, RECORD."""

import tempfile
import unittest
import zipfile
from pathlib import Path

import base_wheel
import repack
import verify_wheel
from common import BuildError, FileChange
from tests.helpers import DEFAULT_FILES, make_wheel

CA = "torch/_dynamo/compiled_autograd.py"
VERSION = "2.13.0+pyca7"


class RepackTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.base = base_wheel.open_and_validate(make_wheel(self.dir), "hash")
        self.out = self.dir / repack.output_filename(self.base, VERSION)

    def tearDown(self):
        self.tmp.cleanup()

    def test_output_name_keeps_the_tags(self):
        self.assertEqual(self.out.name, f"torch-{VERSION}-{self.base.name.tags}.whl")

    def test_wheel_with_changes_verifies(self):
        changes = {
            CA: FileChange(b"patched\n"),
            "torch/old.py": FileChange(None),
            "torch/_compiled_autograd.py": FileChange(b"new = 1\n"),
            "torch/_compiled_autograd_C.so": FileChange(b"\x7fELF...", 0o755),
        }
        repack.write_wheel(self.base, self.out, changes, VERSION)
        self.assertEqual(verify_wheel.verify(self.out), [])
        with zipfile.ZipFile(self.out) as zf:
            names = zf.namelist()
            self.assertNotIn("torch/old.py", names)
            self.assertEqual(names[-1], f"torch-{VERSION}.dist-info/RECORD")
            self.assertFalse(any(n.startswith("torch-2.13.0+cpu.dist-info/") for n in names))
            self.assertEqual(zf.read(CA), b"patched\n")
            self.assertEqual(zf.read("torch/version.py"), b"__version__ = '2.13.0+pyca7'\ngit_version = 'abc'\n")
            self.assertIn(f"Version: {VERSION}\n", zf.read(f"torch-{VERSION}.dist-info/METADATA").decode())
            self.assertEqual(zf.getinfo("torch/_compiled_autograd_C.so").external_attr >> 16, 0o100755)
            self.assertEqual(zf.read(f"torch-{VERSION}.dist-info/licenses/LICENSE"), b"license text\n")
            self.assertEqual(zf.read("torch/__init__.py"), DEFAULT_FILES["torch/__init__.py"])

    def test_version_is_set_on_top_of_a_patched_version_py(self):
        patched = FileChange(b"# patched\n__version__ = '2.13.0+cpu'\n")
        repack.write_wheel(self.base, self.out, {"torch/version.py": patched}, VERSION)
        with zipfile.ZipFile(self.out) as zf:
            self.assertEqual(zf.read("torch/version.py"), b"# patched\n__version__ = '2.13.0+pyca7'\n")

    def test_failed_write_leaves_nothing(self):
        with self.assertRaises(BuildError):
            repack.write_wheel(self.base, self.out, {"torch/version.py": FileChange(b"no version\n")}, VERSION)
        self.assertEqual(list(self.dir.glob("*pyca*")) + list(self.dir.glob(".*tmp")), [])


class VerifierTest(unittest.TestCase):
    """The verifier must notice what the build could get wrong."""

    def test_detects_bad_record_and_version(self):
        with tempfile.TemporaryDirectory() as tmp:
            good = make_wheel(Path(tmp))
            self.assertEqual(verify_wheel.verify(good), [])
            bad = Path(tmp) / "torch-2.13.0+cpu-x-x-x.whl"
            with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
                for info in src.infolist():
                    data = src.read(info)
                    if info.filename == "torch/version.py":
                        data = b"__version__ = '2.13.0+other'\n"
                    dst.writestr(info, data)
            problems = "\n".join(verify_wheel.verify(bad))
            self.assertIn("torch/version.py: RECORD says", problems)
            self.assertIn("__version__ is '2.13.0+other'", problems)
            self.assertIn("WHEEL tags", problems)


if __name__ == "__main__":
    unittest.main()
