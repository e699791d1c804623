"""The raw-copying zip writer."""

import shutil
import subprocess
import tempfile
import unittest
import zipfile
from pathlib import Path

from wheelzip import RawZipWriter

DATE = (2024, 5, 6, 7, 8, 10)


class RawZipWriterTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.source = self.dir / "source.zip"
        with zipfile.ZipFile(self.source, "w") as zf:
            zf.writestr("a/deflated.txt", b"hello " * 1000, compress_type=zipfile.ZIP_DEFLATED)
            zf.writestr("a/stored.bin", bytes(range(256)), compress_type=zipfile.ZIP_STORED)
            zf.writestr("a/empty", b"", compress_type=zipfile.ZIP_DEFLATED)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, force_zip64: bool) -> Path:
        out = self.dir / f"out{int(force_zip64)}.zip"
        with zipfile.ZipFile(self.source) as zf, open(self.source, "rb") as raw, RawZipWriter(out, force_zip64) as w:
            for info in zf.infolist():
                w.copy_member(raw, info, info.filename.replace("a/", "renamed/"))
            w.add("new/exe.sh", b"#!/bin/sh\necho hi\n", 0o755, DATE)
            w.add("new/caf\u00e9.txt", b"", 0o644, DATE)
        return out

    def check(self, out: Path) -> None:
        with zipfile.ZipFile(self.source) as src, zipfile.ZipFile(out) as zf:
            self.assertIsNone(zf.testzip())  # every CRC checks out
            self.assertEqual(zf.namelist(), ["renamed/deflated.txt", "renamed/stored.bin", "renamed/empty",
                                             "new/exe.sh", "new/caf\u00e9.txt"])
            for info in src.infolist():
                copied = zf.getinfo(info.filename.replace("a/", "renamed/"))
                self.assertEqual(zf.read(copied), src.read(info))
                # Raw copy: same compression, same compressed bytes.
                self.assertEqual((copied.compress_type, copied.compress_size, copied.CRC),
                                 (info.compress_type, info.compress_size, info.CRC))
            exe = zf.getinfo("new/exe.sh")
            self.assertEqual(exe.external_attr >> 16, 0o100755)
            self.assertEqual(exe.date_time, DATE)
            self.assertEqual(zf.read(exe), b"#!/bin/sh\necho hi\n")
        if shutil.which("unzip"):  # a second, independent reader
            result = subprocess.run(["unzip", "-tq", str(out)], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_plain(self):
        self.check(self.write(force_zip64=False))

    def test_zip64_records(self):
        out = self.write(force_zip64=True)
        self.assertIn(b"PK\x06\x06", out.read_bytes())
        self.check(out)


if __name__ == "__main__":
    unittest.main()
