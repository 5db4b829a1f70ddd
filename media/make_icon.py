"""Draw media/icon.png (128x128): four shards of a weight matrix and a check mark. Standard library
only: `python media/make_icon.py`."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SIZE, SAMPLES = 128, 4
BACKGROUND = (23, 37, 84)
SHARDS = [(66, 133, 244), (52, 168, 83), (251, 188, 5), (234, 67, 53)]
CHECK = (255, 255, 255)


def inside_rounded(x: float, y: float, x0: float, y0: float, x1: float, y1: float, r: float) -> bool:
    cx = min(max(x, x0 + r), x1 - r)
    cy = min(max(y, y0 + r), y1 - r)
    return (x - cx) ** 2 + (y - cy) ** 2 <= r * r and x0 <= x <= x1 and y0 <= y <= y1


def near_segment(x: float, y: float, a: tuple[float, float], b: tuple[float, float], width: float) -> bool:
    (ax, ay), (bx, by) = a, b
    dx, dy = bx - ax, by - ay
    t = max(0.0, min(1.0, ((x - ax) * dx + (y - ay) * dy) / (dx * dx + dy * dy)))
    px, py = ax + t * dx, ay + t * dy
    return (x - px) ** 2 + (y - py) ** 2 <= (width / 2) ** 2


def colour(x: float, y: float) -> tuple[int, int, int, int]:
    if not inside_rounded(x, y, 4, 4, 124, 124, 22):
        return (0, 0, 0, 0)
    if near_segment(x, y, (40, 66), (58, 86), 11) or near_segment(x, y, (58, 86), (92, 40), 11):
        return (*CHECK, 255)
    boxes = [(20, 20, 62, 62), (66, 20, 108, 62), (20, 66, 62, 108), (66, 66, 108, 108)]
    for (x0, y0, x1, y1), shard in zip(boxes, SHARDS, strict=True):
        if inside_rounded(x, y, x0, y0, x1, y1, 6):
            return (*shard, 255)
    return (*BACKGROUND, 255)


def main() -> None:
    rows = []
    for py in range(SIZE):
        row = bytearray([0])
        for px in range(SIZE):
            total = [0, 0, 0, 0]
            for sy in range(SAMPLES):
                for sx in range(SAMPLES):
                    c = colour(px + (sx + 0.5) / SAMPLES, py + (sy + 0.5) / SAMPLES)
                    for i in range(4):
                        total[i] += c[i]
            row.extend(v // (SAMPLES * SAMPLES) for v in total)
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", SIZE, SIZE, 8, 6, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + chunk(b"IEND", b"")
    (Path(__file__).parent / "icon.png").write_bytes(png)


if __name__ == "__main__":
    main()
