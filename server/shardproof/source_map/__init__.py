"""Source positions and source edits (LibCST). Pure: no LSP types, no torch.

- `spans.refine` maps a report site to the expression or statement it names (the all-reduce call,
  the linear call, the slicing expression), in the text the user has (editor buffer or disk).
- `fixes` turns a discrepancy's mechanical fix into text edits.

Positions: lines are 1-based, columns 0-based in code points, ends exclusive (LibCST's
convention); `spans.utf16_column` converts for LSP clients.
"""

from .fixes import Edit, mechanical_fix
from .spans import Span, refine, utf16_column

__all__ = ["Edit", "Span", "mechanical_fix", "refine", "utf16_column"]
