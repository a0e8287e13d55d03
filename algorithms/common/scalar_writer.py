"""TensorBoard scalars without torch: one event file, one Event per logged step (all its scalars).

`torch.utils.tensorboard.SummaryWriter` costs ~2 s of imports; a tabular run needs only scalars.
The file format is TensorFlow's record framing (length, masked CRC-32C of the length, the Event
protobuf, masked CRC-32C of the data), read by TensorBoard and `EventAccumulator` like any other.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of data, masked as TFRecord files store it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class ScalarWriter:
    """`add_scalars(step, {tag: value})` and `close()`; the file is written through a buffer."""

    def __init__(self, log_dir: str | Path) -> None:
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.scalars"
        self._file = open(log_dir / name, "wb")
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event: Event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data)))

    def add_scalars(self, step: int, scalars: dict[str, float]) -> None:
        values = [Summary.Value(tag=tag, simple_value=float(value)) for tag, value in scalars.items()]
        self._write(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))

    def close(self) -> None:
        self._file.close()
