"""Pieces of the C++ build that do not need a compiler."""

import tempfile
import unittest
from pathlib import Path

import extension
from common import BuildError


class DepfileTest(unittest.TestCase):
    def test_continuations_and_escaped_spaces(self):
        text = "/o/m.cpp.o: /src/m.cpp /inc/a.h \\\n /src/my\\ dir/b.h \\\n /inc/c.h\n/inc/a.h:\n"
        self.assertEqual(extension.parse_depfile(text), ["/src/m.cpp", "/inc/a.h", "/src/my dir/b.h", "/inc/c.h"])

    def test_only_project_files_are_tracked(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp, "overlay")
            (root / "torch/csrc").mkdir(parents=True)
            source, header = root / "torch/csrc/m.cpp", root / "torch/csrc/m.h"
            source.write_text("x")
            header.write_text("y")
            depfile = Path(tmp, "m.d")
            depfile.write_text(f"m.o: {source} {header} /usr/include/stdio.h\n")
            self.assertEqual(set(extension.project_deps(depfile, root)), {str(source), str(header)})


class AbiDetectionTest(unittest.TestCase):
    def test_reads_the_flag_from_the_pybind11_id(self):
        with tempfile.TemporaryDirectory() as tmp:
            lib = Path(tmp, "libtorch_python.so")
            for abi in (0, 1):
                lib.write_bytes(b"\0junk__pybind11_internals_v11_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_%d__\0" % abi)
                self.assertEqual(extension.detect_cxx11_abi(lib), abi)
            lib.write_bytes(b"nothing here")
            with self.assertRaisesRegex(BuildError, "use_cxx11_abi"):
                extension.detect_cxx11_abi(lib)


if __name__ == "__main__":
    unittest.main()
