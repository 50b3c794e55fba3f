"""A TensorBoard scalar writer in plain Python, so runs need no tensorboard package.

An event file is a sequence of TFRecords, each holding one serialized `Event` protobuf:

    record  = len:uint64 | masked_crc32c(len):uint32 | event bytes | masked_crc32c(event):uint32
    Event   = 1: wall_time (double) | 2: step (varint) | 3: file_version (string)
              | 5: Summary { 1: Value { 1: tag (string) | 2: simple_value (float) } ... }

Only scalars are written, which is all the trainer logs. `read_scalars` parses the files back
(used by the tests, and handy without TensorBoard installed). The trainer's `report_to tensorboard` and the engine's `tensorboard` monitor both write through it.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint((number << 3) | wire)
    if wire == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def _event(step: int, wall_time: float, *, version: str | None = None, scalars: dict | None = None) -> bytes:
    body = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if version is not None:
        body += _field(3, 2, version.encode())
    if scalars:
        values = b"".join(_field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", float(v))))
                          for tag, v in scalars.items())
        body += _field(5, 2, values)
    return body


class EventWriter:
    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.file = open(self.folder / name, "ab")
        self._write(_event(0, time.time(), version="brain.Event:2"))

    def _write(self, event: bytes) -> None:
        header = struct.pack("<Q", len(event))
        self.file.write(header + struct.pack("<I", _masked(header)) + event + struct.pack("<I", _masked(event)))

    def add_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self._write(_event(step, time.time(), scalars=scalars))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


# ---- reading back --------------------------------------------------------------------------
def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(data: bytes):
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire == 1:
            value, i = data[i: i + 8], i + 8
        elif wire == 5:
            value, i = data[i: i + 4], i + 4
        elif wire == 2:
            size, i = _read_varint(data, i)
            value, i = data[i: i + size], i + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, value


def read_scalars(folder: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from every event file in `folder`, checking each CRC."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            header = data[i: i + 8]
            (size,) = struct.unpack("<Q", header)
            if struct.unpack("<I", data[i + 8: i + 12])[0] != _masked(header):
                raise ValueError(f"{path}: bad length checksum at byte {i}")
            event = data[i + 12: i + 12 + size]
            if struct.unpack("<I", data[i + 12 + size: i + 16 + size])[0] != _masked(event):
                raise ValueError(f"{path}: bad event checksum at byte {i}")
            i += 16 + size
            step = 0
            for number, value in _fields(event):
                if number == 2:
                    step = value
                elif number == 5:
                    for _, raw in _fields(value):
                        parts = dict(_fields(raw))
                        out.setdefault(parts[1].decode(), []).append((step, struct.unpack("<f", parts[2])[0]))
    return out
