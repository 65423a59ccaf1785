"""Ring-buffer page walk and record gathers: the compiled ``ticklab.trace._ringbuf`` (built by the package's
own build, see setup.py), or the same functions in Python where it was not built.

``walk`` returns each data record's payload offset, timestamp and event type id, the lost-event count from the
pages' "missed events" flags, and the offset of the first page whose commit is impossible (or -1);
``gather`` copies each record's first ``width`` bytes (zeros past the buffer's end); ``cstrings``
cuts NUL-terminated strings out of the buffer as Arrow binary-array buffers (int32 offsets, data).
"""

from __future__ import annotations

import struct

import numpy as np

MISSED_EVENTS = 1 << 31
MISSED_STORED = 1 << 30
COMMIT_MASK = (1 << 27) - 1
PADDING, TIME_EXTEND, TIME_STAMP = 29, 30, 31


def py_walk(
    buffer, start: int, length: int, page_size: int, commit_size: int, data_offset: int
) -> tuple[bytes, bytes, bytes, int, int]:
    offsets: list[int] = []
    stamps: list[int] = []
    lost, bad_page, limit = 0, -1, start + length
    unpack_u32 = struct.Struct("<I").unpack_from
    commit_format = struct.Struct("<Q" if commit_size == 8 else "<I").unpack_from
    page = start
    while page + page_size <= limit and bad_page < 0:
        timestamp = struct.unpack_from("<Q", buffer, page)[0]
        commit = commit_format(buffer, page + 8)[0]
        position = page + data_offset
        end = position + (commit & COMMIT_MASK)
        if end > page + page_size or (commit & MISSED_EVENTS and commit & MISSED_STORED and end + commit_size > limit):
            return _packed(buffer, offsets, stamps, lost, page)
        if commit & MISSED_EVENTS:
            lost += commit_format(buffer, end)[0] if commit & MISSED_STORED else 1
        while position < end:
            if position + 4 > limit:
                return _packed(buffer, offsets, stamps, lost, page)
            header = unpack_u32(buffer, position)[0]
            type_len, delta = header & 0x1F, header >> 5
            if (type_len == 0 or type_len > 28) and not (type_len == PADDING and delta == 0) and position + 8 > limit:
                return _packed(buffer, offsets, stamps, lost, page)
            if type_len <= 28:
                timestamp = (timestamp + delta) & 0xFFFFFFFFFFFFFFFF
                if type_len == 0:
                    data = position + 8
                    position = data + unpack_u32(buffer, position + 4)[0] - 4
                else:
                    data = position + 4
                    position = data + (type_len << 2)
                offsets.append(data)
                stamps.append(timestamp)
            elif type_len == TIME_EXTEND:
                timestamp = (timestamp + (unpack_u32(buffer, position + 4)[0] << 27) + delta) & 0xFFFFFFFFFFFFFFFF
                position += 8
            elif type_len == TIME_STAMP:
                timestamp = ((unpack_u32(buffer, position + 4)[0] << 27) + delta) | (timestamp & ~((1 << 59) - 1))
                position += 8
            else:  # padding: a discarded record or the rest of the page
                if delta == 0:
                    break
                position += 4 + unpack_u32(buffer, position + 4)[0]
        page += page_size
    return _packed(buffer, offsets, stamps, lost, bad_page)


def _packed(
    buffer, offsets: list[int], stamps: list[int], lost: int, bad_page: int
) -> tuple[bytes, bytes, bytes, int, int]:
    where = np.asarray(offsets, dtype=np.int64).tobytes()
    return where, np.asarray(stamps, dtype=np.uint64).tobytes(), py_gather(buffer, where, 2), lost, bad_page


def py_gather(buffer, offsets, width: int) -> bytes:
    data = np.frombuffer(buffer, dtype=np.uint8)
    starts = np.frombuffer(offsets, dtype=np.int64)
    out = np.zeros((len(starts), width), dtype=np.uint8)
    for column in range(width):
        where = starts + column
        inside = (where >= 0) & (where < len(data))
        out[inside, column] = data[where[inside]]
    return out.tobytes()


def py_cstrings(buffer, starts, limits) -> tuple[bytes, bytes]:
    data = bytes(buffer) if not isinstance(buffer, bytes) else buffer
    pieces, offsets, total = [], [0], 0
    for start, limit in zip(
        np.frombuffer(starts, dtype=np.int64).tolist(), np.frombuffer(limits, dtype=np.int64).tolist(), strict=False
    ):
        piece = data[max(start, 0) : max(start + max(limit, 0), 0)].split(b"\0", 1)[0]
        pieces.append(piece)
        total += len(piece)
        offsets.append(total)
    return np.asarray(offsets, dtype=np.int32).tobytes(), b"".join(pieces)


try:
    from ._ringbuf import cstrings, gather, walk

    COMPILED = True
except ImportError:  # not built (a source checkout used without `pip install`): the same, slower
    walk, gather, cstrings = py_walk, py_gather, py_cstrings
    COMPILED = False
