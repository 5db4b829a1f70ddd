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
    """The innermost user frame not known to be innocent. Frames inside installed libraries
    (fairscale, megatron, transformers) are never chosen while a user frame exists: the user can
    only change how they call the library."""
    if site is None or not site.frames:
        return None
    frames = list(site.frames)
    for frame in reversed(frames):
        if frame.library is None and line_of(frame) not in innocent:
            return frame
    return site.innermost


def library_site(site: SourceSite | None, chosen: Frame | None) -> Site | None:
    """The library frame the chosen user frame called into, as related information."""
    if site is None or chosen is None:
        return None
    inner = site.library_frame_inside(chosen)
    if inner is None:
        return None
    return to_site(inner, f"inside {inner.library}: {inner.function}")


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
