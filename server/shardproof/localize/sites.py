"""Choose the source line where a fix belongs, and turn frames into report sites.

A captured node carries every user frame of its call. The innermost frame is not always where
the mistake is: a helper shared with the reference (`rotate_heads`) or used correctly elsewhere
(`reduce_from_tp`, a `shard()` helper) is innocent, and the mistake is in the caller that passed
it the wrong arguments or called it once too often. `pick_frame` walks outward past innocent
lines.
"""

from __future__ import annotations

import os

from ..graph.model import Frame, Graph, SourceSite
from ..results import Site

Line = tuple[str, int]


def line_of(frame: Frame) -> Line:
    return (frame.file, frame.line)


def reference_lines(reference: Graph) -> set[Line]:
    """Every line the reference executes: code shared with it is not where a parallel bug is."""
    lines: set[Line] = set()
    for node in reference.nodes:
        if node.site:
            lines.update(line_of(f) for f in node.site.frames)
    return lines


def pick_frame(site: SourceSite | None, innocent: set[Line]) -> Frame | None:
    if site is None or not site.frames:
        return None
    frames = list(site.frames)
    for frame in reversed(frames):
        if line_of(frame) not in innocent:
            return frame
    return frames[-1]


def to_site(frame: Frame | None, note: str = "") -> Site | None:
    if frame is None:
        return None
    return Site(
        file=frame.file,
        line=frame.line,
        column=None if frame.column is None else frame.column + 1,
        end_line=frame.end_line,
        end_column=None if frame.end_column is None else frame.end_column + 1,
        code=frame.code,
        function=frame.function,
        note=note,
    )


def short(frame: Frame | None) -> str:
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.file)}:{frame.line}"
