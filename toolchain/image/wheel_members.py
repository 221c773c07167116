"""A wheel's members read for the venv layer, inflated by ISA-L instead of zlib.

Inflating the wheelhouse is most of the venv layer's work: on this 2-core machine, all 48 wheels
(6.7 GiB unpacked) took 32.0 CPU-s through `zipfile` (zlib) and 18.3 through ISA-L's inflate
(python-isal, already a dependency for the push's gzip: toolchain/publish/blobs.py), measured one after the
other on 2026-11-28, load 1.4. The members are read as `zipfile` reads them (the local header, then
`compress_size` bytes, stored or deflated) and checked as it checks them: the CRC-32 and the size
the central directory lists, at the end of each member.
"""
from __future__ import annotations

import struct
import zipfile
from typing import BinaryIO, Optional

from isal import isal_zlib

from toolchain.errors import BuildError

CHUNK = 1 << 20
_LOCAL = struct.Struct("<4s22xHH")  # signature, then file name and extra field lengths
_LOCAL_SIG = b"PK\x03\x04"


class Member:
    """One member's bytes: `read(n)` as a file's, `size` known up front (the tar header comes first)."""

    def __init__(self, f: BinaryIO, info: zipfile.ZipInfo, wheel: str):
        self.f, self.info, self.wheel, self.size = f, info, wheel, info.file_size
        self.recorded: Optional[bytes] = None  # the sha256 the wheel's RECORD gives (toolchain/image/venv_layer.py)
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise BuildError("deps", wheel, f"{info.filename} is compressed with method {info.compress_type}; "
                             "a wheel's members are stored or deflated: download the wheel again", [])
        f.seek(info.header_offset)
        head = f.read(_LOCAL.size)
        if len(head) != _LOCAL.size or head[:4] != _LOCAL_SIG:
            raise BuildError("deps", wheel, f"{info.filename}: no local header where the zip's directory says; "
                             "the wheel is damaged: delete it from the wheelhouse and build again", [])
        _, name_len, extra_len = _LOCAL.unpack(head)
        f.seek(info.header_offset + _LOCAL.size + name_len + extra_len)
        self.left = info.compress_size  # compressed bytes not read yet
        self.inflate = isal_zlib.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
        self.pending = bytearray()
        self.crc = self.out = 0
        self.done = False

    def _more(self) -> bytes:
        """The next piece of the member's bytes, b"" at its end (checked there)."""
        if self.inflate is not None and self.inflate.unconsumed_tail:
            data = self.inflate.decompress(self.inflate.unconsumed_tail, CHUNK)
        elif self.left:
            raw = self.f.read(min(CHUNK, self.left))
            if not raw:
                raise BuildError("deps", self.wheel, f"{self.info.filename} ends early: the wheel is truncated; "
                                 "delete it from the wheelhouse and build again", [])
            self.left -= len(raw)
            data = raw if self.inflate is None else self.inflate.decompress(raw, CHUNK)
        else:
            data = b"" if self.inflate is None else self.inflate.flush()
            self.done = not data
        self.crc = isal_zlib.crc32(data, self.crc)
        self.out += len(data)
        if self.done and (self.crc != self.info.CRC or self.out != self.size):
            raise BuildError("deps", self.wheel, f"{self.info.filename} does not match its CRC-32 or size: the wheel "
                             "is damaged; delete it from the wheelhouse and build again", [])
        return data

    def read(self, n: int = -1) -> bytes:
        while not self.done and (n < 0 or len(self.pending) < n):
            self.pending += self._more()
        if n < 0 or n >= len(self.pending):
            block = bytes(self.pending)
            self.pending.clear()
        else:
            block = bytes(self.pending[:n])
            del self.pending[:n]
        return block
