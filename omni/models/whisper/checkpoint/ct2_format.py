"""A reader of CTranslate2's `model.bin`: named arrays plus aliases, nothing else.

The layout (binary version 6, little endian): u32 version; string spec name; u32 spec
revision; u32 variable count, then per variable: string name, u8 rank, u32 dims[rank],
u8 dtype id, u32 byte count, raw bytes; then u32 alias count and per alias two strings
(alias name, target name). A string is a u16 length (counting a trailing NUL) and its bytes.
A file split in parts (model.bin.part1, .part2, ...) is read as their concatenation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# CTranslate2's DataType enum order
DTYPES = {0: np.dtype("<f4"), 1: np.dtype("i1"), 2: np.dtype("<i2"), 3: np.dtype("<i4"), 4: np.dtype("<f2"), 5: "bfloat16"}
SUPPORTED_VERSIONS = (5, 6)


class Ct2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader understands (says why)."""


@dataclass
class Ct2Model:
    spec: str
    revision: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> variable name

    def get(self, name: str) -> np.ndarray:
        return self.variables[self.aliases.get(name, name)]

    def has(self, name: str) -> bool:
        return name in self.variables or name in self.aliases

    def scalar(self, name: str) -> int:
        return int(self.get(name).reshape(-1)[0])


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.off = 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.off + size > len(self.data):
            raise Ct2FormatError(f"truncated model file at byte {self.off} (wanted {size} more bytes)")
        value = struct.unpack_from(fmt, self.data, self.off)
        self.off += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<H")
        raw = bytes(self.take_bytes(n))
        if not raw or raw[-1] != 0:
            raise Ct2FormatError(f"malformed string before byte {self.off}")
        return raw[:-1].decode("utf-8")

    def take_bytes(self, n: int) -> memoryview:
        if self.off + n > len(self.data):
            raise Ct2FormatError(f"truncated model file at byte {self.off} (wanted {n} more bytes)")
        out = self.data[self.off:self.off + n]
        self.off += n
        return out


def model_bin_parts(directory: Path) -> list[Path]:
    """`model.bin`, or its parts in numeric order."""
    whole = directory / "model.bin"
    if whole.is_file():
        return [whole]
    parts = [p for p in directory.glob("model.bin.part*") if p.name[len("model.bin.part"):].isdigit()]
    return sorted(parts, key=lambda p: int(p.name[len("model.bin.part"):]))


def read_ct2_bytes(data: bytes) -> Ct2Model:
    r = _Reader(data)
    version = r.take("<I")
    if version not in SUPPORTED_VERSIONS:
        raise Ct2FormatError(f"unsupported CTranslate2 binary version {version} (this reader knows "
                             f"{SUPPORTED_VERSIONS}); is it a model.bin at all?")
    model = Ct2Model(spec=r.string(), revision=r.take("<I"))
    for _ in range(r.take("<I")):
        name = r.string()
        rank = r.take("<B")
        shape = tuple(r.take("<I") for _ in range(rank))
        type_id = r.take("<B")
        nbytes = r.take("<I")
        dtype = DTYPES.get(type_id)
        if dtype is None or dtype == "bfloat16":
            raise Ct2FormatError(f"variable {name}: unsupported dtype id {type_id}")
        raw = r.take_bytes(nbytes)
        count = int(np.prod(shape)) if shape else 1
        if count * dtype.itemsize != nbytes:
            raise Ct2FormatError(f"variable {name}: {nbytes} bytes do not make shape {shape} of {dtype}")
        model.variables[name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    for _ in range(r.take("<I")):
        alias = r.string()
        model.aliases[alias] = r.string()
    if r.off != len(r.data):
        raise Ct2FormatError(f"{len(r.data) - r.off} unexpected bytes after the aliases")
    return model


def read_ct2(paths: list[Path]) -> Ct2Model:
    """Read a model from `model.bin` or the ordered list of its parts."""
    if not paths:
        raise Ct2FormatError("no model.bin (or model.bin.partN files) found")
    data = b"".join(Path(p).read_bytes() for p in paths)
    return read_ct2_bytes(data)
