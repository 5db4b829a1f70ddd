"""The picture a report carries: the reference's and a rank's values side by side around the
broken operation, linked by what the proof found between them."""

from __future__ import annotations

from typing import Any

from ..graph.model import Node
from ..results import Discrepancy
from ..verify.relations_found import Relation, ranges_text
from .sites import short
from .wording import _ROLES, describe_op


class Pictures:
    """Mixed into `Context` (context.py): `self` is the localizer's context."""

    def _label(self, rels: list[Relation], ref_value: str) -> str:
        if not rels:
            return "no relation"
        rel = rels[0]
        shape = self._shape(ref_value)
        if rel.kind == "equal":
            return "replicated"
        if rel.kind == "sel":
            dim = len(shape) + rel.dim if shape else rel.dim
            return f"slice {ranges_text(rel.ranges)} of dim {dim}"
        if rel.kind == "psum":
            return f"partial sum [{rel.start}:{rel.end}] of {rel.total}"
        if rel.kind == "selw":
            dim = len(shape) + rel.dim if shape else rel.dim
            return f"replicated [{rel.lo}:{rel.hi + rel.length}] of dim {dim}"
        return f"{rel.num}/{rel.den} share"

    def _ref_row(self, value: str, broken: bool = False) -> dict[str, Any]:
        node = self.ref_nodes.get(value)
        if node is None:
            target = self.ref_placeholders[value].target if value in self.ref_placeholders else value
            return {
                "label": target.split(".")[-2] + "." + target.split(".")[-1] if "." in target else target,
                "site": "parameter" if value in self.ref_placeholders else "",
                "broken": broken,
            }
        frame = node.site.innermost if node.site else None
        return {
            "label": describe_op(node),
            "site": short(frame) if frame else "",
            "broken": broken,
            "collective": node.collective is not None,
        }

    def _rank_row(self, rank: int, value: str, broken: bool = False) -> dict[str, Any]:
        node = self.rank_node(rank, value)
        if node is None:
            placeholder = self.rank_placeholders[rank].get(value)
            target = placeholder.target if placeholder else value
            return {
                "label": target.split(".")[-2] + "." + target.split(".")[-1] if "." in target else target,
                "site": "parameter",
                "broken": broken,
            }
        return {
            "label": describe_op(node),
            "site": short(self.rank_frame(node)),
            "broken": broken,
            "collective": node.collective is not None,
        }

    def neighbourhood(self, ref_node: Node, rank: int, d: Discrepancy) -> dict[str, Any]:
        """Rows of the picture: the inputs side by side, then (when the rank lacks one) the missing
        collective, then the operation whose relation broke. Edges say which row feeds which."""
        aligned = self.aligned(ref_node, rank)
        reference: list[dict[str, Any]] = []
        parallel: list[dict[str, Any]] = []
        links: list[dict[str, Any]] = []
        edges: list[dict[str, Any]] = []
        partial_row = None
        wrong = set(d.details.get("wrong_inputs", []))
        roles = _ROLES.get(ref_node.op, [])
        for k, value in enumerate(ref_node.inputs[:3]):
            role = f"{roles[k]}: " if k < len(roles) else ""
            row = self._ref_row(value)
            reference.append({**row, "label": role + row["label"], "row": k})
            counterpart = aligned.inputs[k] if aligned is not None and k < len(aligned.inputs) else None
            if counterpart is None:
                continue
            rels = self.relations_between(value, rank, counterpart)
            bad = not rels or k in wrong
            rank_row = self._rank_row(rank, counterpart, broken=bad)
            parallel.append({**rank_row, "label": role + rank_row["label"], "row": k})
            label = self._label(rels, value)
            links.append({"row": k, "label": label, "status": "broken" if bad else "ok"})
            if rels and all(rel.kind == "psum" for rel in rels):
                partial_row = len(parallel) - 1
        op_row = len(ref_node.inputs[:3])
        if d.kind in ("missing-reduction", "partial-sum-into-nonlinear") and partial_row is not None:
            parallel.append(
                {
                    "label": "all-reduce",
                    "site": "missing here",
                    "missing": True,
                    "broken": True,
                    "collective": True,
                    "row": op_row,
                }
            )
            edges.append({"column": "parallel", "from": partial_row, "to": len(parallel) - 1, "broken": True})
            op_row += 1
        reference.append({**self._ref_row(ref_node.id, broken=True), "row": op_row})
        edges += [{"column": "reference", "from": i, "to": len(reference) - 1} for i in range(len(reference) - 1)]
        if aligned is not None:
            parallel.append({**self._rank_row(rank, aligned.id, broken=True), "row": op_row})
            for i in range(len(parallel) - 1):
                if i == partial_row and parallel[-2].get("missing"):
                    continue
                edges.append({"column": "parallel", "from": i, "to": len(parallel) - 1})
            links.append({"row": op_row, "label": "no relation", "status": "broken"})
        return {"rank": rank, "reference": reference, "parallel": parallel, "links": links, "edges": edges}
