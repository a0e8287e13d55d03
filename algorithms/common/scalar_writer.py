"""TensorBoard scalars without torch: one event file, one Event per logged step (all its scalars).

`torch.utils.tensorboard.SummaryWriter` costs ~2 s of imports; a tabular run needs only scalars.
The file format is TensorFlow's record framing (length, masked CRC-32C of the length, the Event
protobuf, masked CRC-32C of the data), read by TensorBoard and `EventAccumulator` like any other.

A tabular run logs one Event per episode, so this writer is on its hot path (issue 15): the Event is
encoded by hand (the few protobuf fields below, byte for byte what `Event.SerializeToString()` gives,
which tests/test_scalar_writer.py checks) instead of building ~10 protobuf messages per episode, and
the CRC-32C takes four bytes per Python step through two 65,536-entry tables instead of one byte.
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
def _crc32c_tables() -> tuple[list[int], list[int], list[int]]:
    """(byte table, low-half table, high-half table).

    The byte table advances the CRC register by one byte. Four bytes at once: with x = crc ^ word
    (little-endian), the register after the four bytes is F(x), F = four byte steps with zero input;
    F is linear over GF(2), so F(x) = F(x & 0xFFFF) ^ F(x & 0xFFFF0000): two lookups per word.
    Built with numpy (~10 ms) on the first write, not at import.
    """
    crc = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        crc = np.where(crc & 1, (crc >> 1) ^ np.uint32(_POLY), crc >> 1)
    byte = crc.astype(np.uint32)

    def four_steps(x: np.ndarray) -> np.ndarray:
        for _ in range(4):
            x = byte[x & 0xFF] ^ (x >> 8)
        return x

    halves = np.arange(65536, dtype=np.uint32)
    return byte.tolist(), four_steps(halves).tolist(), four_steps(halves << 16).tolist()


def masked_crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of data, masked as TFRecord files store it."""
    byte, low, high = _crc32c_tables()
    words = len(data) // 4
    crc = 0xFFFFFFFF
    for word in struct.unpack_from(f"<{words}I", data):
        x = crc ^ word
        crc = low[x & 0xFFFF] ^ high[x >> 16]
    for b in data[4 * words :]:
        crc = byte[(crc ^ b) & 0xFF] ^ (crc >> 8)
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
        self._write(_event(time.time(), 0, _length_delimited(0x1A, b"brain.Event:2")))

    def _write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data)))

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
