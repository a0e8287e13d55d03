"""TensorBoard scalars without torch: one event file, one Event per logged step (all its scalars).

`torch.utils.tensorboard.SummaryWriter` costs ~2 s of imports; a tabular run needs only scalars.
The file format is TensorFlow's record framing (length, masked CRC-32C of the length, the Event
protobuf, masked CRC-32C of the data), read by TensorBoard and `EventAccumulator` like any other.

A tabular run logs one Event per episode, so this writer is on its hot path: the Event is
encoded by hand (the few protobuf fields below, byte for byte what `Event.SerializeToString()` gives,
which tests/test_scalar_writer.py checks) instead of building ~10 protobuf messages per episode, and
the CRC-32C takes four bytes per Python step (slicing-by-4) instead of one.
"""

from __future__ import annotations

import functools
import math
import socket
import struct
import time
from pathlib import Path

import numpy as np

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected


@functools.cache
def _crc32c_tables() -> tuple[list[int], ...]:
    """Slicing-by-4: tables[k][b] is the CRC register after feeding byte b then k zero bytes (from 0).

    With x = crc ^ (the next four bytes, little-endian), the register after those four bytes is
    tables[3][x & 0xFF] ^ tables[2][(x >> 8) & 0xFF] ^ tables[1][(x >> 16) & 0xFF] ^ tables[0][x >> 24]
    (the CRC step is linear over GF(2)); tables[0] is the classic byte-at-a-time table. Four tables of
    256 entries stay in cache; 65,536-entry tables (two lookups a word) were slower on varied data.
    """
    crc = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        crc = np.where(crc & 1, (crc >> 1) ^ np.uint32(_POLY), crc >> 1)
    tables = [crc.astype(np.uint32)]
    for _ in range(3):  # one more zero byte each
        tables.append(tables[0][tables[-1] & 0xFF] ^ (tables[-1] >> 8))
    return tuple(t.tolist() for t in tables)


def masked_crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of data, masked as TFRecord files store it."""
    t0, t1, t2, t3 = _crc32c_tables()
    words = len(data) // 4
    crc = 0xFFFFFFFF
    for word in struct.unpack_from(f"<{words}I", data):
        x = crc ^ word
        crc = t3[x & 0xFF] ^ t2[(x >> 8) & 0xFF] ^ t1[(x >> 16) & 0xFF] ^ t0[x >> 24]
    for b in data[4 * words :]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------------
# The protobuf wire format of the fields written (tensorboard/compat/proto/event.proto, summary.proto):
# Event {double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5}
# Summary {repeated Value value = 1}; Summary.Value {string tag = 1; float simple_value = 2}
# A key byte is (field number << 3) | wire type (1: 64-bit, 0: varint, 2: length-delimited, 5: 32-bit).


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited(key: int, payload: bytes) -> bytes:
    return bytes((key,)) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
    """As protobuf stores a float field: rounded to single precision, +-inf beyond its range."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def _event(wall_time: float, step: int, rest: bytes) -> bytes:
    # proto3 leaves out a zero step; a negative int64 is its 64-bit two's complement
    step_field = b"\x10" + _varint(step & 0xFFFFFFFFFFFFFFFF) if step else b""
    return b"\x09" + struct.pack("<d", wall_time) + step_field + rest


class ScalarWriter:
    """`add_scalars(step, {tag: value})` and `close()`; the file is written through a buffer."""

    def __init__(self, log_dir: str | Path) -> None:
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.scalars"
        self._file = open(log_dir / name, "wb")
        self._value_heads: dict[str, bytes] = {}  # tag -> an encoded Summary.Value up to its float
        self._headers: dict[int, bytes] = {}  # data length -> its framed header (length and masked CRC)
        self._write(_event(time.time(), 0, _length_delimited(0x1A, b"brain.Event:2")))

    def _write(self, data: bytes) -> None:
        framed = self._headers.get(len(data))
        if framed is None:  # a run's events take a handful of lengths: each header and its CRC is made once
            header = struct.pack("<Q", len(data))
            framed = self._headers[len(data)] = header + struct.pack("<I", masked_crc32c(header))
        self._file.write(framed + data + struct.pack("<I", masked_crc32c(data)))

    def _value_head(self, tag: str) -> bytes:
        name = _length_delimited(0x0A, tag.encode())
        head = self._value_heads[tag] = b"\x0a" + _varint(len(name) + 5) + name + b"\x15"  # 5: key and float32
        return head

    def add_scalars(self, step: int, scalars: dict[str, float]) -> None:
        heads = self._value_heads
        summary = b"".join((heads.get(tag) or self._value_head(tag)) + _float32(float(value)) for tag, value in scalars.items())
        self._write(_event(time.time(), int(step), _length_delimited(0x2A, summary)))

    def close(self) -> None:
        self._file.close()
