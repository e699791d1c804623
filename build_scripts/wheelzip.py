"""A minimal ZIP writer that copies members of another zip without recompressing them.

Python's zipfile can only write data it compresses itself; recompressing the ~700 MB of a
torch wheel would take tens of seconds. Copying a member's compressed bytes as they are
(its CRC and sizes come from the source's central directory) takes well under a second
for the whole wheel. New or changed members are deflated here. Zip64 records are written
when sizes, offsets or the member count need them.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # 30 bytes
CENTRAL_HEADER = struct.Struct("<4s6H3L5H2L")  # 46 bytes
END_OF_CENTRAL_DIR = struct.Struct("<4s4H2LH")  # 22 bytes
ZIP64_END_OF_CENTRAL_DIR = struct.Struct("<4sQ2H2L4Q")  # 56 bytes
ZIP64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes

U32_MAX = 0xFFFFFFFF
U16_MAX = 0xFFFF
MADE_BY_UNIX = (3 << 8) | 45  # external attributes hold Unix modes; zip spec 4.5
FLAG_UTF8 = 0x800
FLAG_DATA_DESCRIPTOR = 0x08
FLAG_ENCRYPTED = 0x01
DEFLATED = 8
CHUNK = 1 << 20


@dataclass
class _Entry:
    """What the central directory needs to know about one written member."""

    name: bytes
    flags: int
    method: int
    dos_time: int
    dos_date: int
    crc: int
    compressed_size: int
    size: int
    offset: int
    external_attr: int


def _dos_datetime(date_time: tuple[int, ...]) -> tuple[int, int]:
    """(time, date) in MS-DOS format from a zipfile-style (Y, M, D, h, m, s) tuple."""
    year, month, day, hour, minute, second = date_time[:6]
    return (hour << 11) | (minute << 5) | (second // 2), ((max(year, 1980) - 1980) << 9) | (month << 5) | day


def _encode_name(name: str) -> tuple[bytes, int]:
    """Member name bytes and the UTF-8 flag they need."""
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), FLAG_UTF8


class RawZipWriter:
    """Write a zip file member by member; call close() (or use `with`) to finish it."""

    def __init__(self, path: Path, force_zip64: bool = False) -> None:
        self._out = open(path, "wb")
        self._entries: list[_Entry] = []
        self._force_zip64 = force_zip64  # lets the tests cover the zip64 code with tiny files

    def __enter__(self) -> "RawZipWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._out.close()

    def copy_member(self, source: BinaryIO, info, name: str) -> None:
        """Copy a member of an open source zip (its zipfile.ZipInfo) as raw compressed bytes."""
        if info.flag_bits & FLAG_ENCRYPTED:
            raise ValueError(f"{info.filename}: encrypted members are not supported")
        source.seek(info.header_offset)
        header = source.read(LOCAL_HEADER.size)
        if header[:4] != b"PK\x03\x04":
            raise ValueError(f"{info.filename}: no local file header at offset {info.header_offset}")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        source.seek(info.header_offset + LOCAL_HEADER.size + name_len + extra_len)
        encoded, utf8 = _encode_name(name)
        dos_time, dos_date = _dos_datetime(info.date_time)
        entry = _Entry(
            name=encoded,
            # Keep only the deflate-option bits; sizes are known, so no data descriptor.
            flags=(info.flag_bits & 0x06) | utf8,
            method=info.compress_type, dos_time=dos_time, dos_date=dos_date, crc=info.CRC,
            compressed_size=info.compress_size, size=info.file_size,
            offset=self._out.tell(), external_attr=info.external_attr,
        )
        self._write_local_header(entry)
        remaining = info.compress_size
        while remaining:
            chunk = source.read(min(CHUNK, remaining))
            if not chunk:
                raise ValueError(f"{info.filename}: source zip is truncated")
            self._out.write(chunk)
            remaining -= len(chunk)
        self._entries.append(entry)

    def add(self, name: str, data: bytes, mode: int, date_time: tuple[int, ...]) -> None:
        """Deflate and write a new member with the given Unix permission bits."""
        compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
        compressed = compressor.compress(data) + compressor.flush()
        encoded, utf8 = _encode_name(name)
        dos_time, dos_date = _dos_datetime(date_time)
        entry = _Entry(
            name=encoded, flags=utf8, method=DEFLATED, dos_time=dos_time, dos_date=dos_date,
            crc=zlib.crc32(data), compressed_size=len(compressed), size=len(data),
            offset=self._out.tell(), external_attr=(0o100000 | mode) << 16,
        )
        self._write_local_header(entry)
        self._out.write(compressed)
        self._entries.append(entry)

    def _needs_zip64(self, *values: int) -> bool:
        return self._force_zip64 or any(v >= U32_MAX for v in values)

    def _write_local_header(self, e: _Entry) -> None:
        """Local header; zip64 sizes go in an extra field when either size is too big."""
        zip64 = self._needs_zip64(e.size, e.compressed_size)
        extra = struct.pack("<2H2Q", 1, 16, e.size, e.compressed_size) if zip64 else b""
        self._out.write(LOCAL_HEADER.pack(
            b"PK\x03\x04", 45 if zip64 else 20, e.flags, e.method, e.dos_time, e.dos_date, e.crc,
            U32_MAX if zip64 else e.compressed_size, U32_MAX if zip64 else e.size,
            len(e.name), len(extra),
        ))
        self._out.write(e.name + extra)

    def _write_central_header(self, e: _Entry) -> None:
        """Central directory record; each field that overflows moves to the zip64 extra."""
        big = [self._needs_zip64(v) for v in (e.size, e.compressed_size, e.offset)]
        values = [e.size, e.compressed_size, e.offset]
        fields = [v for v, is_big in zip(values, big) if is_big]
        extra = struct.pack(f"<2H{len(fields)}Q", 1, 8 * len(fields), *fields) if fields else b""
        size, compressed, offset = (U32_MAX if is_big else v for v, is_big in zip(values, big))
        self._out.write(CENTRAL_HEADER.pack(
            b"PK\x01\x02", MADE_BY_UNIX, 45 if fields else 20, e.flags, e.method, e.dos_time,
            e.dos_date, e.crc, compressed, size, len(e.name), len(extra), 0, 0, 0,
            e.external_attr, offset,
        ))
        self._out.write(e.name + extra)

    def close(self) -> None:
        """Write the central directory and end records, then close the file."""
        start = self._out.tell()
        for entry in self._entries:
            self._write_central_header(entry)
        size = self._out.tell() - start
        count = len(self._entries)
        if self._force_zip64 or count >= U16_MAX or self._needs_zip64(start, size):
            zip64_start = self._out.tell()
            self._out.write(ZIP64_END_OF_CENTRAL_DIR.pack(
                b"PK\x06\x06", ZIP64_END_OF_CENTRAL_DIR.size - 12, MADE_BY_UNIX, 45, 0, 0,
                count, count, size, start,
            ))
            self._out.write(ZIP64_LOCATOR.pack(b"PK\x06\x07", 0, zip64_start, 1))
        self._out.write(END_OF_CENTRAL_DIR.pack(
            b"PK\x05\x06", 0, 0, min(count, U16_MAX), min(count, U16_MAX),
            min(size, U32_MAX), min(start, U32_MAX), 0,
        ))
        self._out.close()
