"""`ScalarWriter` encodes Events by hand and computes CRC-32C four bytes at a time (its hot path): both must
give exactly the bytes of the protobuf library and of the bitwise CRC, and TensorBoard must read them."""

from __future__ import annotations

import os
import struct

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from algorithms.common.scalar_writer import ScalarWriter, masked_crc32c


def bitwise_masked_crc32c(data: bytes) -> int:
    """The textbook CRC-32C, one bit at a time, masked as TFRecord stores it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_crc32c_matches_the_bitwise_definition_at_every_length_remainder():
    assert bitwise_masked_crc32c(b"123456789") == (((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    for length in [*range(13), 271, 4099]:
        data = os.urandom(length)
        assert masked_crc32c(data) == bitwise_masked_crc32c(data), length


def _records(path) -> list[bytes]:
    """The Event payloads of a TFRecord file, checking both CRCs of each record."""
    blob, out, at = path.read_bytes(), [], 0
    while at < len(blob):
        header = blob[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", blob[at + 8 : at + 12])[0] == bitwise_masked_crc32c(header)
        data = blob[at + 12 : at + 12 + length]
        assert struct.unpack("<I", blob[at + 12 + length : at + 16 + length])[0] == bitwise_masked_crc32c(data)
        out.append(data)
        at += 16 + length
    return out


@pytest.mark.parametrize("step", [0, 1, 127, 128, 20_000, 2**40, -3])
def test_events_are_the_bytes_protobuf_serializes(tmp_path, step):
    scalars = {
        "train/episode_return": -2.5,
        "roles/" + "long_name" * 20: 3.0,  # a tag longer than 127 bytes: two-byte length varints
        "é/ü": 0.0,
        "tiny": 1e-50,  # rounds to 0 in single precision
        "huge": -1e300,  # beyond single precision: -inf
        "nan": float("nan"),
    }
    writer = ScalarWriter(tmp_path)
    writer.add_scalars(step, scalars)
    writer.add_scalars(step, {})
    writer.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    first, written, empty = _records(path)
    expected = Event(
        wall_time=Event.FromString(written).wall_time,
        step=step,
        summary=Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]),
    )
    assert written == expected.SerializeToString()
    assert empty == Event(wall_time=Event.FromString(empty).wall_time, step=step, summary=Summary()).SerializeToString()
    header = Event.FromString(first)
    assert header.file_version == "brain.Event:2" and first == header.SerializeToString()


def test_tensorboard_reads_the_scalars_back(tmp_path):
    writer = ScalarWriter(tmp_path)
    for step in range(1, 6):
        writer.add_scalars(step, {"train/episode_return": step / 4, "vcbm/epsilon": 0.2})
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/episode_return")] == [(k, k / 4) for k in range(1, 6)]
    assert [e.value for e in events.Scalars("vcbm/epsilon")] == [pytest.approx(0.2)] * 5
