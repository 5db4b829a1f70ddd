"""From "not proven" to "this line, this mistake".

After saturation every reference value either has relations to each rank's values or not. A
reference value is *broken* on a rank when it has none and every path from it to a failing
output runs through values that have none either; the topologically first broken value is the
point where the parallel program stops computing the reference's function. Detectors then ask
why, using only the proven relations, the rank graphs and the parameter provenance:

  duplicate-reduction      an all-reduce sums values that are already complete
  missing-reduction        a partial sum is consumed by something that is not linear / not reduced
  bias-before-reduction    a replicated parameter is added to a partial sum that is then reduced
  wrong-scaling            a share of a value has the wrong fraction for the partial it joins
  wrong-shard              inputs hold selections that do not fit together; the one that breaks
                           the tiling across ranks is traced back to the slice that made it
  shard-order / wrong-layout   outputs or fused pieces in the wrong order or dimension
  unrelated-parameter      a parameter not derived from the reference
  collective-mismatch      ranks disagree on their collective calls
  scaled-gradient          a gradient is the reference's times a constant (a loss averaged with the
                           wrong count, gradients summed where they should be averaged)

Unknown ops on sharded inputs make the result inconclusive instead of a discrepancy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from ..graph.model import Frame, Graph, Node, Placeholder, SourceSite
from ..relations import expr as px
from ..results import Discrepancy, Site, Unsupported
from ..verify.encode import SCALED_SUFFIX, CollectiveIssue
from ..verify.relations_found import Relation, RelationIndex, ranges_text
from .sites import Line, library_site, line_of, pick_frame, reference_lines, short, to_site
from .stages import missing_layers

_LINEAR_OPS = {
    ("binary", "add"),
    ("binary", "sub"),
    ("scalar", "mul"),
    ("scalar", "div"),
    ("unary", "neg"),
    ("view", None),
    ("permute", None),
    ("slice", None),
    ("cat", None),
    ("expand", None),
}
_ROLES = {
    "sdpa": ["query", "key", "value", "mask"],
    "linear": ["input", "weight"],
    "matmul": ["left", "right"],
    "embedding": ["weight", "ids"],
}
_SUPPORTED = {
    "slice",
    "cat",
    "view",
    "permute",
    "expand",
    "unary",
    "scalar",
    "binary",
    "where",
    "fill",
    "reduce",
    "softmax",
    "log_softmax",
    "linear",
    "matmul",
    "embedding",
    "sdpa",
    "constant",
    "uninitialized",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
}


@dataclass
class Evidence:
    reference: Graph
    ranks: list[Graph]
    rank_values: list[dict[str, px.Expr]]
    index: RelationIndex
    issues: list[CollectiveIssue]
    outputs_of: list[int] | None = None  # the ranks whose outputs are compared (None: every rank)
    # constant factors the encoder carried outside values of joint graphs: (graph, value) -> factor
    factors: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    # opaque calls that rules follow (derived laws, rules matching the call whole): an input
    # relation no rule accepts there is a finding, not an unsupported operation
    law_targets: frozenset[str] = frozenset()


def _fn(node: Node) -> str | None:
    return node.attrs.get("fn") if node.op in ("unary", "scalar", "binary", "reduce") else None


_OP_NAMES = {
    "linear": "linear",
    "matmul": "matmul",
    "embedding": "embedding lookup",
    "sdpa": "attention",
    "view": "reshape",
    "permute": "transpose",
    "slice": "slice",
    "cat": "concatenation",
    "expand": "expand",
    "where": "where",
    "fill": "masked_fill",
    "softmax": "softmax",
    "log_softmax": "log_softmax",
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "broadcast": "broadcast",
    "constant": "constant",
}


def _describe_op(node: Node) -> str:
    """A short human name: `silu`, `add`, `linear layers.0.attention.wo`, `attention`."""
    fn = _fn(node)
    if node.op == "generic":
        return str(node.attrs.get("target", "op")).replace("aten::", "")
    if node.op == "scalar":
        return f"{fn} by {node.attrs.get('value')}"
    if node.op == "reduce":
        return str(fn)
    name = str(fn) if fn else _OP_NAMES.get(node.op, node.op)
    if fn and fn.startswith("cast_"):
        name = f"cast to {fn.removeprefix('cast_')}"
    if node.op in ("linear", "embedding") and node.module_path:
        return f"{name} {node.module_path}"
    return name


class Localizer:
    def __init__(self, evidence: Evidence) -> None:
        self.ev = evidence
        self.index = evidence.index
        self.reference = evidence.reference
        self.ref_nodes = self.reference.node_map()
        self.ref_placeholders = {p.id: p for p in self.reference.placeholders}
        self.rank_nodes = [g.node_map() for g in evidence.ranks]
        self.rank_placeholders = [{p.id: p for p in g.placeholders} for g in evidence.ranks]
        self.rank_consumers = [g.consumers() for g in evidence.ranks]
        self.topo = {n.id: i for i, n in enumerate(self.reference.nodes)}
        self.ref_lines = reference_lines(self.reference)
        # user line -> the library frame it called into, for every rank site shown (related info)
        self.library_calls: dict[Line, Site] = {}

    # -- entry point ----------------------------------------------------------------------------------
    def explain(self, failing_outputs: list[int]) -> Discrepancy | Unsupported:
        if self.ev.issues:
            return self.collective_mismatch(self.ev.issues[0])
        unplaced = missing_layers(self.reference, self.ev.ranks, self.ev.rank_values)
        if unplaced is not None:
            return unplaced
        missing = self.missing_gradient(failing_outputs) or self.scaled_gradient(failing_outputs)
        if missing is not None:
            return missing
        duplicate = self.duplicate_reduction()
        broken: list[tuple[int, int, str]] = []
        failing_ids = [self.reference.outputs[i] for i in failing_outputs]
        compared = self.ev.outputs_of if self.ev.outputs_of is not None else range(len(self.ev.ranks))
        for rank in compared:
            first = self.first_broken(rank, failing_ids)
            if first is not None:
                broken.append((self.topo[first], rank, first))
        if duplicate is not None and (not broken or duplicate.details.get("topo", 1 << 30) <= min(broken)[0] + 1):
            return duplicate
        if not broken:
            return self.output_mismatch(failing_outputs)
        # The earliest broken value, on the first rank where a detector can name a location; ranks
        # that skip the computation entirely (a full slice is no node at all) have nothing to show.
        fallback: Discrepancy | Unsupported | None = None
        for _, rank, node_id in sorted(broken):
            ranks = sorted({r for _, r, n in broken if n == node_id})
            found = self.diagnose(self.ref_nodes[node_id], rank, ranks)
            if isinstance(found, Unsupported) or (found.primary is not None):
                return found
            fallback = fallback or found
        assert fallback is not None
        return fallback

    def diagnose(self, node: Node, rank: int, ranks: list[int]) -> Discrepancy | Unsupported:
        detectors: list[Callable[[Node, int], Discrepancy | Unsupported | None]] = [
            self.stage_handover,
            self.partial_misuse,
            self.embedding_mask,
            self.target_pick_mask,
            self.mismatch,
        ]
        found: Discrepancy | Unsupported | None = None
        for detector in detectors:
            found = detector(node, rank)
            if found is not None:
                break
        if found is None:
            found = self.not_equivalent(node, rank, ranks)
        if isinstance(found, Discrepancy):
            found.ranks = found.ranks or ranks
            found.details.setdefault("neighbourhood", self.neighbourhood(node, rank, found))
        return found

    # -- pictures ------------------------------------------------------------------------------------
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
            "label": _describe_op(node),
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
            "label": _describe_op(node),
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

    def first_broken(self, rank: int, failing_ids: list[str]) -> str | None:
        if self.ev.outputs_of is not None:
            # a pipeline: earlier stages compute the reference's earlier values on other ranks
            everywhere = range(len(self.ev.ranks))
            unrelated = {n.id for n in self.reference.nodes if not any(self.index.related(n.id, r) for r in everywhere)}
        else:
            unrelated = {n.id for n in self.reference.nodes if not self.index.related(n.id, rank)}
        harmful: set[str] = set()
        stack = [o for o in failing_ids if o in unrelated]
        while stack:
            value = stack.pop()
            if value in harmful:
                continue
            harmful.add(value)
            node = self.ref_nodes.get(value)
            if node is not None:
                stack.extend(i for i in node.inputs if i in unrelated)
        for node in self.reference.nodes:
            if node.id in harmful and not any(i in harmful for i in node.inputs):
                return node.id
        return None

    # -- helpers ------------------------------------------------------------------------------------
    def rank_node(self, rank: int, value: str) -> Node | None:
        return self.rank_nodes[rank].get(value)

    def site_of_value(self, graph_nodes: dict[str, Node], value: str) -> SourceSite | None:
        node = graph_nodes.get(value)
        return node.site if node is not None else None

    def ref_site(self, node: Node, note: str = "") -> Site | None:
        frame = node.site.innermost if node.site else None
        return to_site(frame, note)

    def rank_site(self, node: Node, note: str = "", innocent: set[Line] | None = None) -> Site | None:
        return to_site(self.rank_frame(node, innocent), note)

    def rank_frame(self, node: Node, innocent: set[Line] | None = None) -> Frame | None:
        frame = pick_frame(node.site, self.ref_lines | (innocent or set()))
        inside = library_site(node.site, frame)
        if frame is not None and inside is not None:
            self.library_calls.setdefault(line_of(frame), inside)
        return frame

    def with_library_context(self, found: Discrepancy | Unsupported) -> Discrepancy | Unsupported:
        """A report at a user line that called into a library also shows the library's line."""
        if isinstance(found, Discrepancy) and found.primary is not None:
            inside = self.library_calls.get((found.primary.file, found.primary.line))
            if inside is not None and all((s.file, s.line) != (inside.file, inside.line) for s in found.related):
                found.related.append(inside)
        return found

    def with_plan_context(self, found: Discrepancy | Unsupported) -> Discrepancy | Unsupported:
        """A discrepancy in the output of a torch module that a DTensor plan parallelized (an
        `nn.Linear`, `nn.Embedding`, `nn.RMSNorm`) is made in the plan: its entry becomes where
        the fix belongs, and the line that runs the module stays as related information."""
        if not isinstance(found, Discrepancy) or found.primary is None:
            return found
        graphs = {graph.name: graph for graph in self.ev.ranks}
        for reference in found.parallel_nodes:
            graph_name, _, node_id = reference.partition("/")
            graph = graphs.get(graph_name)
            node = self.rank_node(graph.rank, node_id) if graph is not None and graph.rank is not None else None
            if node is None or not node.module_type.startswith("torch."):
                continue
            entry = graph.plan_entries.get(node.module_path) if graph is not None else None
            if entry is None:
                continue
            runs_here = replace(found.primary, note=found.primary.note or f"`{node.module_path}` runs here")
            found.primary = to_site(entry, f"the plan parallelizes `{node.module_path}` with {entry.function}")
            found.related.insert(0, runs_here)
            found.suggestion = f"{found.suggestion} (in the plan entry for `{node.module_path}`: its layouts)".lstrip()
            return found
        return found

    def relations_between(self, ref_value: str, rank: int, value: str) -> list[Relation]:
        return [rel for rel, values in self.index.relations(ref_value, rank) if value in values]

    def is_related(self, rank: int, value: str) -> bool:
        return bool(self.index.relations_of_rank_value(rank, value))

    def ref_value_name(self, value: str) -> str:
        """`the output of linear layers.0.attention.wo`, `layers.0.attention.wo.bias`."""
        if value in self.ref_placeholders:
            return self.ref_placeholders[value].target
        node = self.ref_nodes.get(value)
        if node is None:
            return value
        where = f" in {node.module_path}" if node.module_path and node.op not in ("linear", "embedding") else ""
        return f"the output of {_describe_op(node)}{where}"

    def aligned(self, ref_node: Node, rank: int) -> Node | None:
        """The rank node that plays the part of `ref_node`: same op, inputs related to its inputs."""
        related_inputs: list[set[str]] = []
        for value in ref_node.inputs:
            related_inputs.append({v for _, vals in self.index.relations(value, rank) for v in vals})
        best: tuple[int, int, int, Node] | None = None
        by_name: Node | None = None
        for order, node in enumerate(self.ev.ranks[rank].nodes):
            if node.op != ref_node.op or _fn(node) != _fn(ref_node):
                continue
            matches = sum(1 for k, v in enumerate(node.inputs) if k < len(related_inputs) and v in related_inputs[k])
            loose = sum(1 for v in node.inputs if any(v in s for s in related_inputs))
            if node.id == ref_node.id:
                by_name = node
            candidate = (matches * 4 + loose * 2 + (node.id == ref_node.id), -order, order, node)
            if (matches or loose) and (best is None or candidate[:2] > best[:2]):
                best = candidate
        if best is not None:
            return best[3]
        # No op of the same kind reads the related inputs: the rank computes something else from
        # them (a reshape where the reference transposes), which plays the part.
        if len(ref_node.inputs) == 1:
            for node in self.ev.ranks[rank].nodes:
                reads_related = bool(node.inputs) and any(node.inputs[0] in s for s in related_inputs)
                if reads_related and node.op in ("view", "permute", "expand", "slice"):
                    return node
        return by_name

    def downstream_all_reduce(
        self, rank: int, value: str, depth: int = 8, kinds: tuple[str, ...] = ("all_reduce",)
    ) -> Node | None:
        """The first reduction of `kinds` that a value reaches through linear data movement."""
        frontier = [value]
        seen: set[str] = set()
        for _ in range(depth):
            next_frontier: list[str] = []
            for v in frontier:
                for consumer_id in self.rank_consumers[rank].get(v, []):
                    if consumer_id in seen:
                        continue
                    seen.add(consumer_id)
                    consumer = self.rank_nodes[rank][consumer_id]
                    if consumer.op in kinds:
                        return consumer
                    if (
                        consumer.op,
                        _fn(consumer) if consumer.op in ("binary", "scalar", "unary") else None,
                    ) in _LINEAR_OPS:
                        next_frontier.append(consumer_id)
            frontier = next_frontier
        return None

    def is_parameter_value(self, rank: int, value: str) -> str | None:
        """Name of the parameter or buffer a rank value is (or is a share of), if any."""
        placeholder = self.rank_placeholders[rank].get(value)
        if placeholder is not None and placeholder.kind in ("parameter", "buffer"):
            return placeholder.target
        c = self.index.class_of(f"rank{rank}", value)
        if c is not None:
            for ref_value in self.index.reference_values(c):
                ref_placeholder = self.ref_placeholders.get(ref_value)
                if ref_placeholder is not None and ref_placeholder.kind in ("parameter", "buffer"):
                    return ref_placeholder.target
        node = self.rank_node(rank, value)
        if node is not None and node.op in ("scalar", "view", "unary") and node.inputs:
            return self.is_parameter_value(rank, node.inputs[0])
        return None

    # -- detectors ----------------------------------------------------------------------------------
    def collective_mismatch(self, issue: CollectiveIssue) -> Discrepancy:
        graph_name, node_id = issue.nodes[0] if issue.nodes else ("", "")
        rank = int(graph_name.removeprefix("rank")) if graph_name.startswith("rank") else 0
        node = self.rank_node(rank, node_id)
        related = []
        for other_graph, other_id in issue.nodes[1:4]:
            other_rank = int(other_graph.removeprefix("rank"))
            other = self.rank_node(other_rank, other_id)
            if other is not None:
                related.append(self.rank_site(other, f"rank {other_rank}: {other.op}"))
        found = Discrepancy(
            kind="collective-mismatch",
            message=issue.message,
            primary=self.rank_site(node) if node else None,
            related=[s for s in related if s],
            ranks=list(issue.group),
            parallel_nodes=[f"{g}/{n}" for g, n in issue.nodes],
            expected="every rank of the group makes the same sequence of collective calls",
            found=issue.message,
            suggestion="make every rank of the group call the same collectives in the same order",
        )
        found.details["neighbourhood"] = self._collective_picture(issue)
        return found

    def _collective_picture(self, issue: CollectiveIssue) -> dict[str, Any]:
        """Two ranks side by side: the collective call each makes at the position where they disagree."""
        columns: list[list[dict[str, Any]]] = [[], []]
        titles = []
        for column, (graph_name, node_id) in enumerate(issue.nodes[:2]):
            rank = int(graph_name.removeprefix("rank")) if graph_name.startswith("rank") else column
            titles.append(f"rank {rank}")
            node = self.rank_node(rank, node_id)
            row = (
                self._rank_row(rank, node_id, broken=True)
                if node is not None
                else {"label": "no collective", "site": "missing here", "missing": True, "broken": True}
            )
            columns[column].append({**row, "row": 0})
        if len(issue.nodes) < 2:
            titles.append("other ranks")
            columns[1].append(
                {"label": "no collective", "site": "missing here", "missing": True, "broken": True, "row": 0}
            )
        return {
            "rank": 0,
            "titles": titles,
            "reference": columns[0],
            "parallel": columns[1],
            "links": [{"row": 0, "label": "collective calls differ", "status": "broken"}],
            "edges": [],
        }

    def duplicate_reduction(self) -> Discrepancy | None:
        """An all-reduce whose input already equals a reference value: it multiplies by the group size."""
        for rank, graph in enumerate(self.ev.ranks):
            correct_lines = self._correct_collective_lines(rank)
            for node in graph.nodes:
                if node.op != "all_reduce" or node.collective is None or node.collective.reduce_op != "sum":
                    continue
                if len(node.collective.group) <= 1:
                    continue
                source = node.inputs[0]
                c = self.index.class_of(graph.name, source)
                out_c = self.index.class_of(graph.name, node.id)
                if c is None or not self.index.has_reference_member(c):
                    continue
                if out_c is not None and self.index.has_reference_member(out_c):
                    continue
                ref_value = self.index.reference_values(c)[0]
                ref_node = self.ref_nodes.get(ref_value)
                producer = self.rank_node(rank, source)
                related = []
                if producer is not None:
                    related.append(self.rank_site(producer, "the value is already complete here"))
                if ref_node is not None:
                    related.append(self.ref_site(ref_node, "the reference value it already equals"))
                n = len(node.collective.group)
                topo = self.topo.get(ref_value, 0)
                return Discrepancy(
                    kind="duplicate-reduction",
                    message=f"this all-reduce sums a value that every rank already holds in full "
                    f"({self.ref_value_name(ref_value)}), so the result is {n}x too large",
                    primary=self.rank_site(node, innocent=correct_lines),
                    reference=self.ref_site(ref_node) if ref_node else None,
                    related=[s for s in related if s],
                    ranks=list(node.collective.group),
                    reference_node=ref_value,
                    parallel_nodes=[f"{graph.name}/{node.id}"],
                    expected=f"rank {rank} holds {self.ref_value_name(ref_value)} in full (replicated)",
                    found=f"the all-reduce adds the {n} identical copies",
                    suggestion="remove the second all-reduce (the value was reduced already)",
                    details={
                        "topo": topo,
                        "fix": {"action": "unwrap", "title": "Remove the duplicate all-reduce"},
                        "neighbourhood": self._duplicate_picture(rank, ref_value, source, node),
                    },
                )
        return None

    def _duplicate_picture(self, rank: int, ref_value: str, source: str, reduction: Node) -> dict[str, Any]:
        times = len(reduction.collective.group) if reduction.collective else "n"
        reference = [{**self._ref_row(ref_value), "row": 0}]
        parallel = [
            {**self._rank_row(rank, source), "row": 0},
            {**self._rank_row(rank, reduction.id, broken=True), "label": "all-reduce (again)", "row": 1},
        ]
        links = [
            {"row": 0, "label": "replicated: already complete", "status": "ok"},
            {"row": 1, "from_row": 0, "label": f"{times}x the reference value", "status": "broken"},
        ]
        edges = [{"column": "parallel", "from": 0, "to": 1, "broken": True}]
        return {"rank": rank, "reference": reference, "parallel": parallel, "links": links, "edges": edges}

    def reduction_helper(self) -> str | None:
        """The user's own all-reduce helper (`reduce_from_tp`), from the all-reduces that work."""
        names: dict[str, int] = {}
        for rank, graph in enumerate(self.ev.ranks):
            for node in graph.nodes:
                if node.op != "all_reduce" or node.site is None or node.site.innermost is None:
                    continue
                out_c = self.index.class_of(graph.name, node.id)
                if out_c is None or not self.index.has_reference_member(out_c):
                    continue
                function = node.site.innermost.function
                if function not in ("forward", "<module>") and len(node.site.frames) > 1:
                    names[function] = names.get(function, 0) + 1
            del rank
        return max(names, key=lambda n: names[n]) if names else None

    def _correct_collective_lines(self, rank: int) -> set[Line]:
        """Innermost lines of all-reduces that do their job: a helper used correctly elsewhere."""
        lines: set[Line] = set()
        graph = self.ev.ranks[rank]
        for node in graph.nodes:
            if node.op != "all_reduce" or node.site is None or node.site.innermost is None:
                continue
            out_c = self.index.class_of(graph.name, node.id)
            if out_c is not None and self.index.has_reference_member(out_c):
                lines.add(line_of(node.site.innermost))
        return lines

    def partial_misuse(self, ref_node: Node, rank: int) -> Discrepancy | None:
        for position, value in enumerate(ref_node.inputs):
            relations = self.index.relations(value, rank)
            if not relations or any(rel.kind not in ("psum", "pmax") for rel, _ in relations):
                continue
            partials = [(rel, v) for rel, values in relations for v in values]
            consumers = [
                (rel, v, self.rank_nodes[rank][c]) for rel, v in partials for c in self.rank_consumers[rank].get(v, [])
            ]
            if not consumers:
                continue
            reductions = [item for item in consumers if item[2].op == "all_reduce"]
            if reductions:
                return self.reduction_coverage(ref_node, value, rank, reductions[0][2])
            # Where the partial sum leaks: a consumer whose own output is not again a partial sum
            # of the same value (masking a lookup keeps it partial; a wrong regrouping does not).
            still_partial = {v for _, v in partials}
            leaks = [item for item in consumers if item[2].id not in still_partial]
            consumers = leaks or consumers
            aligned = self.aligned(ref_node, rank)
            rel, partial_value, consumer = next(
                (item for item in consumers if aligned is not None and item[2].id == aligned.id), consumers[0]
            )
            return self._partial_consumed(ref_node, value, position, rank, rel, partial_value, consumer)
        return None

    def _partial_consumed(
        self,
        ref_node: Node,
        ref_value: str,
        position: int,
        rank: int,
        rel: Relation,
        partial_value: str,
        consumer: Node,
    ) -> Discrepancy:
        producer = self.rank_node(rank, partial_value)
        reduced = "input features" if producer is not None and producer.op == "linear" else "reduced indices"
        partial = "partial max" if rel.kind == "pmax" else "partial sum"
        holds = (
            f"rank {rank} holds a {partial} over its {reduced} [{rel.start}:{rel.end}] of {rel.total}"
            if rel.total
            else f"rank {rank} holds a {partial}"
        )
        ref_input = self.ref_nodes.get(ref_value)
        other_values = [v for v in consumer.inputs if v != partial_value]
        reference_site = self.ref_site(ref_node, "the reference uses the full value here")
        if consumer.op == "binary" and consumer.attrs.get("fn") in ("add", "sub") and other_values:
            other = other_values[0]
            share = self._share_of(rank, other, ref_node)
            if share is not None:
                num, den, share_node = share
                width = rel.end - rel.start
                if width * den != rel.total * num:
                    counted = f"{num * rel.total}/{den * width}" if width else "?"
                    return Discrepancy(
                        kind="wrong-scaling",
                        message=f"this rank adds {num}/{den} of {self.ref_value_name(share_node)} to a partial sum "
                        f"over {width}/{rel.total} of the reduction; after the all-reduce it counts "
                        f"{counted} times instead of once",
                        primary=self._share_site(rank, other),
                        reference=reference_site,
                        related=[s for s in [self.rank_site(consumer, "where the share joins the partial sum")] if s],
                        reference_node=ref_node.id,
                        parallel_nodes=[f"rank{rank}/{consumer.id}"],
                        expected=f"a {width}/{rel.total} share of the bias on each rank",
                        found=f"a {num}/{den} share",
                        suggestion=f"scale the share by {width}/{rel.total} exactly once",
                    )
            parameter = self.is_parameter_value(rank, other)
            reduction = self.downstream_all_reduce(rank, consumer.id)
            early = self._reduced_through_movement(rank, other)
            if early is not None and reduction is not None:
                # Two partial sums meant to be reduced together: one was reduced on its own first,
                # so the later all-reduce counts it world-size times.
                return Discrepancy(
                    kind="duplicate-reduction",
                    message=f"this all-reduce completes a partial sum that is then added to another partial sum "
                    f"and all-reduced again with it, so it counts {len(self.ev.ranks)} times",
                    # a reduction helper's own line is shared with the later all-reduce: its caller
                    primary=self.rank_site(
                        early, innocent={line_of(f) for f in reduction.site.frames} if reduction.site else None
                    ),
                    reference=reference_site,
                    related=[
                        s
                        for s in [
                            self.rank_site(consumer, "where the reduced value joins the partial sum"),
                            self.rank_site(reduction, "the all-reduce that reduces it again"),
                        ]
                        if s
                    ],
                    reference_node=ref_node.id,
                    parallel_nodes=[f"rank{rank}/{early.id}", f"rank{rank}/{consumer.id}"],
                    expected="both partial sums added first and all-reduced once",
                    found=f"{holds}, plus a value all-reduced already",
                    suggestion="remove this all-reduce: the sum it joins is all-reduced afterwards",
                )
            if parameter is not None and reduction is not None:
                return Discrepancy(
                    kind="bias-before-reduction",
                    message=f"{parameter} is added to a partial sum on every rank before the all-reduce, so it "
                    f"is counted {len(self.ev.ranks)} times",
                    primary=self.rank_site(consumer),
                    reference=reference_site,
                    related=[s for s in [self.rank_site(reduction, "the all-reduce that sums the biases")] if s],
                    reference_node=ref_node.id,
                    parallel_nodes=[f"rank{rank}/{consumer.id}"],
                    expected=f"{parameter} added once, after the all-reduce",
                    found=f"{holds}, plus the full {parameter} on every rank",
                    suggestion=f"add {parameter} after the all-reduce (or add 1/world_size of it on every rank)",
                    details=self._fix("move-out", f"Add {parameter} after the all-reduce"),
                )
        movement = consumer.op in ("view", "permute", "slice", "cat", "expand")
        reduction = self.downstream_all_reduce(rank, consumer.id, kinds=("all_reduce", "reduce_scatter"))
        if movement and reduction is not None:
            # The partial sums do reach a reduction, but rearranged on the way in a layout the
            # reference's value does not have (chunks regrouped wrongly before a reduce-scatter).
            where = self.rank_site(consumer).short() if consumer.site else "?"
            return Discrepancy(
                kind="wrong-layout",
                message=f"the partial sums are rearranged by the {_describe_op(consumer)} at {where} before the "
                f"{_describe_op(reduction)}, into a layout that does not match the reference's value",
                primary=self.rank_site(consumer),
                reference=reference_site,
                related=[s for s in [self.rank_site(reduction, "the reduction it feeds")] if s],
                reference_node=ref_node.id,
                parallel_nodes=[f"rank{rank}/{partial_value}", f"rank{rank}/{consumer.id}"],
                expected=f"{self.ref_value_name(ref_value)} in the layout the reduction splits or sums",
                found=holds,
                suggestion="rearrange the partial sums so that the reduction's chunks are the ranks' slices",
            )
        kind = "missing-reduction" if consumer.op in ("binary",) or rel.kind == "pmax" else "partial-sum-into-nonlinear"
        producer_site = self.rank_site(producer, f"the {partial} is produced here") if producer else None
        what = self.ref_value_name(ref_value) if ref_input is not None else ref_value
        consumer_desc = _describe_op(consumer)
        source = _describe_op(producer) if producer is not None else "partial computation"
        consumer_where = self.rank_site(consumer).short() if consumer.site else "?"
        reduce_op = " (max)" if rel.kind == "pmax" else ""
        message = (
            f"the {partial} of the {source} reaches the {consumer_desc} at {consumer_where} "
            f"without an all-reduce{reduce_op}"
        )
        related = [
            s
            for s in [
                self.rank_site(consumer, f"the {partial} is used by {consumer_desc} here"),
                self.ref_site(ref_input, "the reference produces the full value here")
                if ref_input is not None
                else None,
            ]
            if s
        ]
        return Discrepancy(
            kind=kind,
            message=message,
            primary=producer_site or self.rank_site(consumer),
            reference=reference_site,
            related=related,
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{partial_value}", f"rank{rank}/{consumer.id}"],
            expected=f"{what} in full on every rank (replicated), as input {position} of the {_describe_op(ref_node)}",
            found=holds,
            suggestion=(
                "all-reduce the partial maxes (op=MAX over the tensor-parallel group) before using them"
                if rel.kind == "pmax"
                else "all-reduce the partial sums (sum over the tensor-parallel group) before using them"
            ),
            details={**self._fix("wrap", "Insert the missing all-reduce"), "holdings": self._holdings(ref_value)},
        )

    def _reduced_through_movement(self, rank: int, value: str, depth: int = 6) -> Node | None:
        """The all-reduce (sum) that `value` is, through views and permutes, if any."""
        for _ in range(depth):
            node = self.rank_node(rank, value)
            if node is None:
                return None
            if node.op == "all_reduce":
                coll = node.collective
                return node if coll is None or (coll.reduce_op or "sum") == "sum" else None
            if node.op not in ("view", "permute") or not node.inputs:
                return None
            value = node.inputs[0]
        return None

    def _fix(self, action: str, title: str) -> dict[str, Any]:
        """A mechanical fix, offered when the code has a reduction helper to call."""
        helper = self.reduction_helper()
        if helper is None:
            return {}
        return {"fix": {"action": action, "function": helper, "title": f"{title} ({helper})"}}

    def _holdings(self, ref_value: str) -> dict[str, str]:
        """What every rank holds of a reference value, for explanations."""
        shape = self._shape(ref_value)
        node = self.ref_nodes.get(ref_value)
        reduced = "input features" if node is not None and node.op in ("linear", "matmul") else "reduced indices"
        out: dict[str, str] = {}
        for rank in range(len(self.ev.ranks)):
            relations = self.index.relations(ref_value, rank)
            if relations:
                rel = relations[0][0]
                out[str(rank)] = "the full value" if rel.kind == "equal" else rel.describe(shape, reduced)
            else:
                out[str(rank)] = "nothing related"
        return out

    def _share_of(self, rank: int, value: str, ref_node: Node) -> tuple[int, int, str] | None:
        """(num, den, reference value) when a rank value is num/den of a reference value."""
        c = self.index.class_of(f"rank{rank}", value)
        for ref_value in ref_node.inputs:
            for rel, values in self.index.relations(ref_value, rank):
                if rel.kind == "frac" and value in values:
                    return rel.num, rel.den, ref_value
        del c
        return None

    def _share_site(self, rank: int, value: str) -> Site | None:
        node = self.rank_node(rank, value)
        if node is not None:
            return self.rank_site(node, "the share is computed here")
        return self.provenance_site(rank, value)

    def reduction_coverage(self, ref_node: Node, ref_value: str, rank: int, reduction: Node) -> Discrepancy | None:
        """The all-reduce exists but its inputs' partial sums do not tile the reduction."""
        ranges: dict[int, list[Relation]] = {}
        for r in range(len(self.ev.ranks)):
            for rel, _values in self.index.relations(ref_value, r):
                if rel.kind == "psum":
                    ranges.setdefault(r, []).append(rel)
        missing = [r for r in range(len(self.ev.ranks)) if r not in ranges]
        held = {r: (rels[0].start, rels[0].end) for r, rels in ranges.items()}
        total = next(iter(ranges.values()))[0].total if ranges else 0
        duplicated = [r for r in held for q in held if q < r and held[q] == held[r]]
        offender = (missing or duplicated or [rank])[0]
        partial = self._partial_input(offender, reduction)
        origin = self._partial_site(offender, partial) if partial is not None else None
        description = ", ".join(f"rank {r}: [{s}:{e}]" for r, (s, e) in sorted(held.items()))
        if missing:
            found = f"ranks {missing} hold no partial sum of it; {description}"
        else:
            found = f"the partial sums cover {description} of {total}"
        return Discrepancy(
            kind="wrong-shard",
            message=f"the all-reduce at {self.rank_site(reduction).short() if reduction.site else '?'} sums partial "
            f"results that do not tile the reduction ({found})",
            primary=origin or self.rank_site(reduction),
            reference=self.ref_site(ref_node, "the reference computes the full value here"),
            related=[s for s in [self.rank_site(reduction, "the all-reduce")] if s],
            ranks=[offender],
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{reduction.id}"],
            expected=f"partial sums over disjoint ranges covering all {total} reduced indices, one per rank",
            found=found,
            suggestion="give every rank its own shard (rank r of n holds block r)",
        )

    def _partial_site(self, rank: int, value: str) -> Site | None:
        node = self.rank_node(rank, value)
        if node is not None:
            return self.rank_site(node, "this rank's partial sum is computed here")
        return self.provenance_site(rank, value)

    def _partial_input(self, rank: int, reduction: Node) -> str | None:
        graph = self.ev.ranks[rank]
        for node in graph.nodes:
            if node.op == "all_reduce" and node.site == reduction.site:
                return node.inputs[0]
        return None

    def embedding_mask(self, ref_node: Node, rank: int) -> Discrepancy | None:
        if ref_node.op != "embedding":
            return None
        graph = self.ev.ranks[rank]
        nodes = self.rank_nodes[rank]
        weight_ref = ref_node.inputs[0]
        for node in graph.nodes:
            if node.op != "embedding":
                continue
            shard = [
                rel
                for rel in self.relations_between(weight_ref, rank, node.inputs[0])
                if rel.kind == "sel" and rel.dim == -2 and len(rel.ranges) == 1
            ]
            if not shard:
                continue
            start, end = shard[0].ranges[0]
            ids = nodes.get(node.inputs[1])
            kept, offset, mask_node = self._mask_interval(nodes, ids)
            if kept is None:
                continue
            problems = []
            if kept != (start, end):
                problems.append(
                    f"the mask keeps token ids [{kept[0]}:{kept[1]}] but this rank holds embedding rows [{start}:{end}]"
                )
            if offset is not None and offset != start:
                problems.append(f"local ids are shifted by {offset} instead of {start}")
            if not problems:
                continue
            culprit = mask_node if kept != (start, end) else ids
            return Discrepancy(
                kind="wrong-shard",
                message="vocab-parallel embedding: " + "; ".join(problems),
                primary=self.rank_site(culprit) if culprit else self.rank_site(node),
                reference=self.ref_site(ref_node, "the reference looks up every token id"),
                related=[s for s in [self.rank_site(node, f"the lookup in embedding rows [{start}:{end}]")] if s],
                reference_node=ref_node.id,
                parallel_nodes=[f"rank{rank}/{node.id}"],
                expected=f"rank {rank} looks up exactly the ids in [{start}:{end}] and zeroes the rest",
                found=problems[0],
                suggestion=f"mask ids outside [{start}, {end}): (ids < {start}) | (ids >= {end})",
            )
        return None

    def stage_handover(self, ref_node: Node, rank: int) -> Discrepancy | None:
        """A pipeline stage hands on one input of the reference's next step (a value the reference
        computes) where the receiving stage needs that step's result: a boundary that drops the
        other inputs (the residual stream). Reported at the send."""
        if self.ev.outputs_of is None:
            return None
        for sender, graph in enumerate(self.ev.ranks):
            for node in graph.nodes:
                if node.op != "p2p" or not node.attrs.get("send"):
                    continue
                handed = [
                    ref
                    for rel, refs in self.index.relations_of_rank_value(sender, node.inputs[0])
                    for ref in refs
                    if rel.kind == "equal"
                ]
                if not any(value in ref_node.inputs for value in handed):
                    continue
                others = [v for v in ref_node.inputs if v not in handed]
                if not others:
                    continue
                what = self.ref_value_name(handed[0])
                dropped = ", ".join(self.ref_value_name(v) for v in others)
                receiver = node.attrs.get("peer")
                return Discrepancy(
                    kind="wrong-handover",
                    message=f"rank {sender} hands rank {receiver} {what}, but the reference's next step "
                    f"({_describe_op(ref_node)}) also needs {dropped}: the stage boundary drops it",
                    primary=self.rank_site(node, "what this stage hands on"),
                    reference=self.ref_site(ref_node, "the reference combines them here"),
                    ranks=[sender],
                    reference_node=ref_node.id,
                    parallel_nodes=[f"rank{sender}/{node.id}"],
                    expected=f"the {_describe_op(ref_node)}'s value (or all of its inputs) sent to rank {receiver}",
                    found=f"{what} alone",
                    suggestion="send what the next stage needs to continue: the combined value, or every input",
                )
        return None

    def target_pick_mask(self, ref_node: Node, rank: int) -> Discrepancy | None:
        """A vocabulary-parallel loss picks each target's logit on the rank holding its class: it
        must pick local ids (target - start, masked) and zero the picks of targets outside its
        classes [start, end) before the all-reduce."""
        if ref_node.op != "pick":
            return None
        graph = self.ev.ranks[rank]
        nodes = self.rank_nodes[rank]
        dim = ref_node.attrs.get("dim", -1)
        for node in graph.nodes:
            if node.op != "pick":
                continue
            shard = [
                rel
                for rel in self.relations_between(ref_node.inputs[0], rank, node.inputs[0])
                if rel.kind == "sel" and rel.dim == dim and len(rel.ranges) == 1
            ]
            if not shard:
                continue
            start, end = shard[0].ranges[0]
            kept, offset, mask_node = self._mask_interval(nodes, nodes.get(node.inputs[1]))
            problems = []
            culprit: Node | None = None
            if kept is not None and kept != (start, end):
                problems.append(
                    f"the mask keeps targets [{kept[0]}:{kept[1]}] but this rank holds classes [{start}:{end}]"
                )
                culprit = mask_node
            elif offset is not None and offset != start:
                problems.append(f"local target ids are shifted by {offset} instead of {start}")
                culprit = nodes.get(node.inputs[1])
            elif kept is not None and not self._zeroed_outside(rank, node):
                problems.append(
                    f"the logits picked for targets outside [{start}:{end}] are not zeroed before the all-reduce"
                )
                culprit = node
            if not problems:
                continue
            return Discrepancy(
                kind="wrong-shard",
                message="vocab-parallel target logit: " + "; ".join(problems),
                primary=self.rank_site(culprit) if culprit else self.rank_site(node),
                reference=self.ref_site(ref_node, "the reference picks every target's logit"),
                related=[s for s in [self.rank_site(node, f"the pick from classes [{start}:{end}]")] if s],
                reference_node=ref_node.id,
                parallel_nodes=[f"rank{rank}/{node.id}"],
                expected=f"rank {rank} picks exactly the targets in [{start}:{end}] and zeroes the rest",
                found=problems[0],
                suggestion=f"mask targets outside [{start}, {end}): (targets < {start}) | (targets >= {end}), "
                "pick target - start, and zero the picks of masked targets",
            )
        return None

    def _zeroed_outside(self, rank: int, pick: Node) -> bool:
        """Whether the pick's value is zeroed where its targets are masked (a fill by the mask)."""
        consumers = [self.rank_nodes[rank][c] for c in self.rank_consumers[rank].get(pick.id, [])]
        while len(consumers) == 1 and consumers[0].op == "view":
            consumers = [self.rank_nodes[rank][c] for c in self.rank_consumers[rank].get(consumers[0].id, [])]
        return any(c.op in ("fill", "where") for c in consumers)

    def _mask_interval(
        self, nodes: dict[str, Node], ids: Node | None
    ) -> tuple[tuple[int, int] | None, int | None, Node | None]:
        """For fill(ids - c, (ids < a) | (ids >= b)) style masks: (kept interval, c, mask node)."""
        if ids is None or ids.op not in ("fill", "where"):
            return None, None, None
        if ids.op == "fill":
            shifted, mask = nodes.get(ids.inputs[0]), nodes.get(ids.inputs[1])
        else:
            mask, shifted = nodes.get(ids.inputs[0]), nodes.get(ids.inputs[2])
        offset = None
        if shifted is not None and shifted.op == "scalar" and shifted.attrs.get("fn") == "sub":
            offset = int(shifted.attrs["value"])
        if mask is None or mask.op != "binary" or mask.attrs.get("fn") != "or":
            return None, offset, None
        low, high = 0, None
        for value in mask.inputs:
            cmp = nodes.get(value)
            if cmp is None or cmp.op != "scalar":
                return None, offset, None
            fn, bound = cmp.attrs.get("fn"), cmp.attrs.get("value")
            if not isinstance(bound, int | float):
                return None, offset, None
            bound = int(bound)
            if fn == "lt":
                low = bound
            elif fn == "le":
                low = bound + 1
            elif fn == "ge":
                high = bound
            elif fn == "gt":
                high = bound + 1
            else:
                return None, offset, None
        if high is None:
            return None, offset, None
        culprit = next((nodes[v] for v in mask.inputs if nodes[v].attrs.get("fn") in ("le", "gt")), mask)
        return (low, high), offset, culprit

    def mismatch(self, ref_node: Node, rank: int) -> Discrepancy | Unsupported | None:
        aligned = self.aligned(ref_node, rank)
        if aligned is None:
            return None
        wrong: list[tuple[int, str, str]] = []
        for k, (ref_value, value) in enumerate(zip(ref_node.inputs, aligned.inputs, strict=False)):
            if not self.relations_between(ref_value, rank, value):
                wrong.append((k, ref_value, value))
        proper_shards = False
        if not wrong:
            unsupported = self._unsupported(ref_node, rank)
            if unsupported is not None:
                return unsupported
            wrong, proper_shards = self._inconsistent_inputs(ref_node, aligned, rank)
        if not wrong:
            return None
        k, ref_value, value = wrong[0]
        handover = self.handover_frame(self.rank_node(rank, value), aligned) if proper_shards else None
        if handover is not None:
            # A proper shard that reached an op needing another layout: it was computed right and
            # passed on unconverted (a missing gather), so the fix is where it was passed on.
            culprit_site, how = to_site(handover), "handover"
        else:
            culprit_site, how = self.blame(rank, value)
        if how.startswith("unsupported:") or (aligned.op == "generic" and not self._followed(aligned)):
            op = how.removeprefix("unsupported:") if how.startswith("unsupported:") else _describe_op(aligned)
            return Unsupported(
                reason="unsupported-op",
                message=f"no rule relates {op} on rank {rank} to the reference; the check cannot follow the "
                f"parallel computation past it",
                op=op,
                site=culprit_site or self.rank_site(aligned),
            )
        found_rels = self.index.relations_of_rank_value(rank, value)
        expected = f"input {k} of the {_describe_op(ref_node)} holds part of {self.ref_value_name(ref_value)}"
        found = (
            "; ".join(self._holding(rel, refs[0]) for rel, refs in found_rels[:2])
            or "a value unrelated to anything the reference computes"
        )
        kind = "wrong-shard" if found_rels else "not-equivalent"
        if how == "provenance-cat":
            kind = "shard-order"
        if how == "unrelated-parameter":
            kind = "unrelated-parameter"
        if how in ("handover", "layout"):
            kind = "wrong-layout"
        where = self.rank_site(aligned).short() if aligned.site else "?"
        message = (
            f"rank {rank} applies the {_describe_op(aligned)} at {where} to {found}, where the reference uses "
            f"{self.ref_value_name(ref_value)}"
        )
        gather = self.rank_node(rank, value)
        if (
            gather is not None
            and gather.op == "all_gather"
            and gather.inputs
            and self._is_replicated(rank, gather.inputs[0])
        ):
            # Gathering what every rank already holds in full repeats it world-size times: a
            # sequence-parallel region entered without its scatter (or one gather too many).
            message += (
                "; it is the all-gather of a value every rank already holds in full, so the value was not "
                "split (scattered) before the gather, or the gather is one too many"
            )
            how = "gather-of-whole"
        return Discrepancy(
            kind=kind,
            message=message,
            primary=culprit_site or self.rank_site(aligned),
            reference=self.ref_site(ref_node, f"the reference computes {_describe_op(ref_node)} here"),
            related=[s for s in [self.rank_site(aligned, f"rank {rank} computes {_describe_op(aligned)} here")] if s],
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{aligned.id}", f"rank{rank}/{value}"],
            expected=expected,
            found=found,
            suggestion=(
                "this rank's value is a proper shard, but not in the layout this operation needs: fix the line "
                "that passes it on (a missing gather, or a view in the wrong layout)"
                if how == "handover"
                else "scatter the value before this gather (each rank keeps its slice), or drop the gather"
                if how == "gather-of-whole"
                else "join the pieces in the order the reference's layout has (each copy next to its source, "
                "as repeat_interleave does, rather than tiled copies)"
                if how == "layout"
                else "make this rank hold the slice its partners expect (see the first location)"
            ),
            details={"blame": how, "wrong_inputs": [w[0] for w in wrong]},
        )

    def _holding(self, rel: Relation, ref_value: str) -> str:
        shape = self._shape(ref_value)
        name = self.ref_value_name(ref_value)
        if rel.kind == "equal":
            return name
        return f"{rel.describe(shape)} of {name}"

    def _shape(self, ref_value: str) -> tuple[int, ...] | None:
        try:
            return self.reference.meta_of(ref_value).shape
        except KeyError:
            return None

    def _followed(self, node: Node) -> bool:
        """Whether rules follow this opaque call (derived laws, or a rule matching it whole)."""
        from ..verify.rules import opaque_ops

        target = str(node.attrs.get("target", ""))
        return target in self.ev.law_targets or target in opaque_ops()

    def _unsupported(self, ref_node: Node, rank: int) -> Unsupported | None:
        if ref_node.op in _SUPPORTED or (ref_node.op == "generic" and self._followed(ref_node)):
            return None
        nonlocal_inputs = [
            v for v in ref_node.inputs if any(rel.kind != "equal" for rel, _ in self.index.relations(v, rank))
        ]
        if not nonlocal_inputs:
            return None
        return Unsupported(
            reason="unsupported-op",
            message=f"no rule relates {_describe_op(ref_node)} on sharded or partial inputs; the check cannot "
            f"follow the parallel computation past it",
            op=_describe_op(ref_node),
            site=self.ref_site(ref_node),
        )

    def handover_frame(self, producer: Node | None, consumer: Node) -> Frame | None:
        """The user line that passed a value from where it was computed to where it was used: the
        deepest frame both call stacks share, or the consumer's line when both ran in one function."""
        if producer is None or producer.site is None or consumer.site is None:
            return None
        made, used = producer.site.frames, consumer.site.frames
        depth = 0
        while depth < min(len(made), len(used)) and (made[depth].file, made[depth].line, made[depth].function) == (
            used[depth].file,
            used[depth].line,
            used[depth].function,
        ):
            depth += 1
        same_function = depth < min(len(made), len(used)) and (made[depth].file, made[depth].function) == (
            used[depth].file,
            used[depth].function,
        )
        chosen = used[depth] if same_function else (used[depth - 1] if depth else None)
        if chosen is None or chosen.library is not None:
            return None
        return chosen

    def _inconsistent_inputs(self, ref_node: Node, aligned: Node, rank: int) -> tuple[list[tuple[int, str, str]], bool]:
        """All inputs are related, but their selections do not fit: blame the one that does not
        tile; and whether every blamed input is a proper shard (tiles across the ranks)."""
        scored: list[tuple[bool, int, str, str]] = []
        for k, (ref_value, value) in enumerate(zip(ref_node.inputs, aligned.inputs, strict=False)):
            rels = self.relations_between(ref_value, rank, value)
            if any(rel.kind == "equal" for rel in rels):
                continue
            scored.append((self._tiles_across_ranks(ref_value, aligned, k), k, ref_value, value))
        anchors = [s for s in scored if s[0]]
        suspects = [s for s in scored if not s[0]]
        if anchors and suspects:
            return [(k, ref_value, value) for _, k, ref_value, value in suspects], False
        # Every input is a proper shard but they do not combine (a sequence shard meeting a
        # vocabulary-sharded weight): a parameter's shard is the loader's deliberate layout, so
        # the computed input that reached the op in the wrong layout is blamed first.
        if not scored or not all(tiles for tiles, *_ in scored):
            return [(k, ref_value, value) for _, k, ref_value, value in scored[-1:]], False
        computed = [s for s in scored if self.is_parameter_value(rank, s[3]) is None]
        return [(k, ref_value, value) for _, k, ref_value, value in (computed or scored)[-1:]], True

    def _tiles_across_ranks(self, ref_value: str, aligned: Node, position: int) -> bool:
        """Do the ranks' selections of this input tile it in rank order (allowing replicated blocks)?"""
        spans: list[tuple[int, int, int]] = []
        for r in range(len(self.ev.ranks)):
            counterpart = next((n for n in self.ev.ranks[r].nodes if n.id == aligned.id), None)
            if counterpart is None or position >= len(counterpart.inputs):
                return False
            rels = [
                rel
                for rel in self.relations_between(ref_value, r, counterpart.inputs[position])
                if rel.kind in ("sel", "psum")
            ]
            if not rels:
                return False
            rel = rels[0]
            if rel.kind == "sel":
                if len(rel.ranges) != 1:
                    return False
                spans.append((rel.dim, *rel.ranges[0]))
            else:
                spans.append((0, rel.start, rel.end))
        # The blocks must cover the whole dim: every rank holding block 0 tiles nothing.
        shape = self._shape(ref_value)
        dims = {d for d, _, _ in spans}
        size = shape[dims.pop()] if shape is not None and len(dims) == 1 and spans[0][0] != 0 else None
        return blocked_tiling([(s, e) for _, s, e in spans], size)

    def blame(self, rank: int, value: str, depth: int = 0) -> tuple[Site | None, str]:
        """Walk back from a wrong rank value to where its wrongness was introduced."""
        if depth > 40:
            return None, "depth"
        if value in self.rank_placeholders[rank]:
            return self.provenance_blame(rank, value)
        node = self.rank_node(rank, value)
        if node is None:
            return None, "unknown"
        if node.op == "generic" and not self._followed(node):
            return self.rank_site(node), f"unsupported:{_describe_op(node)}"
        if node.op in ("slice", "cat", "view", "permute", "expand") and self._varies_across_ranks(rank, node):
            return self.rank_site(node, "this slice differs between ranks"), "rank-dependent-slice"
        unrelated_inputs = [
            v for v in node.inputs if not self.is_related(rank, v) and not self._is_constant_like(rank, v)
        ]
        if unrelated_inputs:
            producer = self.rank_node(rank, unrelated_inputs[0])
            if producer is not None and producer.collective is not None and producer.collective.kind == "all_gather":
                # A gathered buffer (the ranks' pieces stacked along dim 0) is rarely a value the
                # reference has; what this op makes of it is where a wrong regrouping happens.
                return self.rank_site(node), "after-gather"
            return self.blame(rank, unrelated_inputs[0], depth + 1)
        if self._scatters_selection(rank, node):
            # Contiguous pieces joined into a scattered selection (tiled instead of interleaved
            # heads): related, but in a layout the reference never has. Formed here.
            return self.rank_site(node, "the pieces are joined in this order here"), "layout"
        sharded = [v for v in node.inputs if not self._is_replicated(rank, v)]
        if sharded:
            return self.blame(rank, sharded[-1], depth + 1)
        return self.rank_site(node), "node"

    def _scatters_selection(self, rank: int, node: Node) -> bool:
        """The node holds a selection of several ranges although each input is one range."""

        def widest(value: str) -> int:
            rels = [rel for rel, _ in self.index.relations_of_rank_value(rank, value) if rel.kind == "sel"]
            return min((len(rel.ranges) for rel in rels), default=0)

        if node.op != "cat" or widest(node.id) < 2:
            return False
        return all(widest(v) == 1 for v in node.inputs)

    def _is_replicated(self, rank: int, value: str) -> bool:
        c = self.index.class_of(f"rank{rank}", value)
        return c is not None and self.index.has_reference_member(c)

    def _is_constant_like(self, rank: int, value: str) -> bool:
        node = self.rank_node(rank, value)
        return node is not None and node.op in ("constant",)

    def _varies_across_ranks(self, rank: int, node: Node) -> bool:
        """The same line takes a different slice on another rank (or none at all)."""
        if node.site is None or node.site.innermost is None:
            return False
        key = [line_of(f) for f in node.site.frames]
        mine = (node.op, tuple(sorted(node.attrs.items())) if node.op == "slice" else ())
        for r, graph in enumerate(self.ev.ranks):
            if r == rank:
                continue
            others = [
                (n.op, tuple(sorted(n.attrs.items())) if n.op == "slice" else ())
                for n in graph.nodes
                if n.site is not None and [line_of(f) for f in n.site.frames] == key
            ]
            if mine not in others:
                return True
        return False

    def provenance_site(self, rank: int, value: str) -> Site | None:
        site, _ = self.provenance_blame(rank, value)
        return site

    def provenance_blame(self, rank: int, value: str) -> tuple[Site | None, str]:
        placeholder = self.rank_placeholders[rank][value]
        expr = self.ev.rank_values[rank].get(placeholder.target)
        if expr is None:
            return None, "provenance"
        problems = px.problems(expr)
        if problems:
            leaf = problems[0]
            return to_site(pick_frame(leaf.site, self.ref_lines)), "unrelated-parameter"
        innocent = self._consistent_provenance_lines()
        inconsistent = self._inconsistent_slices(placeholder.target)
        if inconsistent is not None:
            return to_site(pick_frame(inconsistent.site, innocent), "this slice is taken per rank"), "provenance-slice"
        if isinstance(expr, px.CatOf):
            return to_site(pick_frame(expr.site, innocent), "the pieces are assembled here"), "provenance-cat"
        return to_site(pick_frame(expr.site, innocent), "this rank's value is loaded here"), "provenance"

    def _inconsistent_slices(self, target: str) -> px.SliceOf | None:
        """The first slice in a parameter's provenance whose per-rank ranges do not tile its source."""
        per_rank: list[list[px.SliceOf]] = []
        for values in self.ev.rank_values:
            expr = values.get(target)
            per_rank.append([] if expr is None else [e for e in _walk(expr) if isinstance(e, px.SliceOf)])
        if not per_rank or any(len(s) != len(per_rank[0]) for s in per_rank):
            return None
        for position in range(len(per_rank[0])):
            slices = [s[position] for s in per_rank]
            ranges = [(s.start, s.end) for s in slices]
            if len(set(ranges)) == 1:
                continue  # the same slice on every rank: structure, not sharding
            if not blocked_tiling(ranges):
                return slices[0] if len(per_rank) == 1 else slices[-1]
        for position in range(len(per_rank[0])):
            slices = [s[position] for s in per_rank]
            if len({(s.start, s.end) for s in slices}) == 1 and len(per_rank) > 1:
                size = slices[0].source.shape[slices[0].dim]
                if (slices[0].end - slices[0].start) * len(per_rank) == size:
                    return slices[0]  # every rank takes the same 1/n block: nobody holds the rest
        return None

    def _consistent_provenance_lines(self) -> set[Line]:
        """Lines that made correctly tiled slices for some parameter: helpers, innocent."""
        lines: set[Line] = set()
        targets = set(self.ev.rank_values[0]) if self.ev.rank_values else set()
        for target in targets:
            per_rank = [values.get(target) for values in self.ev.rank_values]
            if any(e is None for e in per_rank):
                continue
            slices = [[e for e in _walk(expr) if isinstance(e, px.SliceOf)] for expr in per_rank if expr]
            if any(len(s) != len(slices[0]) for s in slices):
                continue
            for position in range(len(slices[0])):
                group = [s[position] for s in slices]
                ranges = [(s.start, s.end) for s in group]
                if len(set(ranges)) > 1 and blocked_tiling(ranges):
                    for s in group:
                        if s.site and s.site.innermost:
                            lines.add(line_of(s.site.innermost))
        return lines

    def output_mismatch(self, failing_outputs: list[int]) -> Discrepancy:
        index = failing_outputs[0] if failing_outputs else 0
        ref_value = self.reference.outputs[index] if index < len(self.reference.outputs) else ""
        ref_node = self.ref_nodes.get(ref_value)
        ref_meta = self.reference.meta_of(ref_value) if ref_value else None
        for rank, graph in enumerate(self.ev.ranks):
            if index >= len(graph.outputs):
                continue
            value = graph.outputs[index]
            node = self.rank_node(rank, value)
            meta = graph.meta_of(value)
            if ref_meta is not None and meta.shape != ref_meta.shape:
                return self._with_output_picture(
                    ref_value,
                    rank,
                    value,
                    f"shape {list(meta.shape)} ≠ {list(ref_meta.shape)}",
                    Discrepancy(
                        kind="wrong-layout",
                        message=f"rank {rank} returns output {index} with shape {list(meta.shape)}; the reference "
                        f"returns {list(ref_meta.shape)}",
                        primary=self.rank_site(node) if node else None,
                        reference=self.ref_site(ref_node) if ref_node else None,
                        ranks=[rank],
                        reference_node=ref_value,
                        parallel_nodes=[f"{graph.name}/{value}"],
                        expected=f"shape {list(ref_meta.shape)}",
                        found=f"shape {list(meta.shape)}",
                        suggestion="gather or reshape along the dimension the reference uses",
                    ),
                )
        spans = []
        for rank, graph in enumerate(self.ev.ranks):
            rels = self.relations_between(ref_value, rank, graph.outputs[index]) if index < len(graph.outputs) else []
            spans.append(rels)
        node = self.rank_node(0, self.ev.ranks[0].outputs[index]) if self.ev.ranks else None
        found = (
            "; ".join(
                f"rank {r}: {rels[0].describe(ref_meta.shape if ref_meta else None)}"
                for r, rels in enumerate(spans)
                if rels
            )
            or "values unrelated to the reference output"
        )
        sel = [rels[0] for rels in spans if rels and rels[0].kind == "sel"]
        kind = "not-equivalent"
        if sel and len(sel) == len(spans):
            kind = "shard-order"
        elif any(rels and rels[0].kind == "psum" for rels in spans):
            kind = "missing-reduction"
        rank0_output = self.ev.ranks[0].outputs[index] if self.ev.ranks else ""
        return self._with_output_picture(
            ref_value,
            0,
            rank0_output,
            spans[0][0].describe(ref_meta.shape if ref_meta else None) if spans and spans[0] else "no relation",
            Discrepancy(
                kind=kind,
                message=f"{self._output_name(index)} does not equal the reference's on every rank ({found})",
                primary=self.rank_site(node) if node else None,
                reference=self.ref_site(ref_node) if ref_node else None,
                ranks=list(range(len(self.ev.ranks))),
                reference_node=ref_value,
                expected=self._output_expectation(index),
                found=found,
                suggestion=self._output_suggestion(index, kind),
            ),
        )

    def missing_gradient(self, failing_outputs: list[int]) -> Discrepancy | None:
        """A rank that computes no gradient at all for a parameter the reference trains: its
        forward detaches the path (reported at the detach), or the parameter is frozen or unused
        on the rank (reported at the parameter's use)."""
        for index in failing_outputs:
            parameter = self._gradient_of(index)
            if parameter is None:
                continue
            ranks = [
                r
                for r, graph in enumerate(self.ev.ranks)
                if index < len(graph.gradient_roles)
                and (role := graph.gradient_roles[index]) is not None
                and role.absent
            ]
            if not ranks:
                continue
            graph = self.ev.ranks[ranks[0]]
            role = graph.gradient_roles[index]
            assert role is not None
            cuts = graph.gradient_cuts
            if cuts:
                primary = to_site(pick_frame(cuts[-1], self.ref_lines), "the gradient stops here")
                cause = "its forward detaches the value the gradient flows through"
            else:
                use = self._first_use(ranks[0], role.rank_parameter or parameter)
                primary = self.rank_site(use, "the parameter is used here") if use else None
                cause = "the parameter is frozen or takes no part in the loss on the rank"
            return Discrepancy(
                kind="missing-gradient",
                message=f"rank {ranks[0]} computes no gradient for `{role.rank_parameter}` "
                f"(the reference trains `{parameter}`): {cause}",
                primary=primary,
                reference=None,
                ranks=ranks,
                reference_node=self.reference.outputs[index],
                expected=f"the gradient of `{parameter}` (or its block) on every rank",
                found="no gradient (zeros)",
                suggestion="let the gradient flow: remove the detach / no_grad on this path, or train the parameter",
            )
        return None

    def factor(self, graph: str, value: str) -> Fraction:
        return self.ev.factors.get((graph, value), Fraction(1))

    def scaled_gradient(self, failing_outputs: list[int]) -> Discrepancy | None:
        """A gradient that is the reference's times a constant: the unscaled values agree, the
        factors carried outside them do not. The loss a rank seeds backward with is checked first:
        a data-parallel rank's loss over its items should carry the reference's factor times the
        number of ranks its gradients are averaged over (a local mean, averaged by the all-reduce).
        A seed off by another factor (micro-batch means summed instead of divided by their number or
        by the step's item count) is the mistake; otherwise the gradients' reduction is (summed
        where they should be averaged, or divided twice)."""
        for index in failing_outputs:
            parameter = self._gradient_of(index)
            if parameter is None:
                continue
            ref_value = self.reference.outputs[index]
            ref_class = self._unscaled_class("reference", ref_value)
            for rank, graph in enumerate(self.ev.ranks):
                if index >= len(graph.outputs):
                    continue
                value = graph.outputs[index]
                own = self._unscaled_class(graph.name, value)
                if own is None or own != ref_class:
                    continue
                ratio = self.factor(graph.name, value) / self.factor("reference", ref_value)
                if ratio == 1:
                    continue
                return self._scaled_gradient_report(index, parameter, rank, value, ratio)
        return None

    def _unscaled_class(self, graph: str, value: str) -> int | None:
        """The e-class of the value without the factor carried outside it (the value's, if none)."""
        unscaled = self.index.class_of(graph, value + SCALED_SUFFIX)
        return unscaled if unscaled is not None else self.index.class_of(graph, value)

    def _scaled_gradient_report(
        self, index: int, parameter: str, rank: int, value: str, ratio: Fraction
    ) -> Discrepancy:
        graph = self.ev.ranks[rank]
        nodes = self.rank_nodes[rank]
        reduction = self._reduction_upstream(rank, value)
        averaged_over = len(reduction.collective.group) if reduction is not None and reduction.collective else 1
        reference_seed = next(iter(self._seed_losses(self.reference, self.ref_nodes)), None)
        expected_seed = self.factor("reference", reference_seed) * averaged_over if reference_seed is not None else None
        wrong_seed = next(
            (
                seed
                for seed in self._seed_losses(graph, nodes)
                if expected_seed is not None and self.factor(graph.name, seed) != expected_seed
            ),
            None,
        )
        times = str(ratio)  # "2", "1/2"
        base = f"rank {rank}'s gradient of `{parameter}` is {times} × the reference's"
        if wrong_seed is not None:
            by = str(self.factor(graph.name, wrong_seed) / expected_seed)  # type: ignore[operator]
            primary = (
                self.rank_site(nodes[wrong_seed], "the loss backward starts from") if wrong_seed in nodes else None
            )
            cause = (
                f"the loss it runs backward from is {by} × what averaging over its items needs "
                "(per-micro-batch means added up instead of the total divided by the number of items)"
            )
            suggestion = (
                "divide each micro-batch's summed loss by the number of items in the whole step "
                "(or its mean by the number of micro-batches)"
            )
        else:
            primary = self.rank_site(reduction, "the gradients are reduced here") if reduction is not None else None
            cause = "the ranks' gradients are combined with the wrong scale (summed where they should be averaged)"
            suggestion = (
                "average the gradients over the data-parallel ranks (divide the all-reduced sum by their number)"
            )
        ref_node = self.ref_nodes.get(self.reference.outputs[index])
        return Discrepancy(
            kind="scaled-gradient",
            message=f"{base}: {cause}",
            primary=primary,
            reference=self.ref_site(ref_node) if ref_node is not None else None,
            ranks=list(range(len(self.ev.ranks))),
            reference_node=self.reference.outputs[index],
            parallel_nodes=[f"{graph.name}/{value}"],
            expected=f"the gradient of `{parameter}` as the reference computes it",
            found=f"{times} × that gradient",
            suggestion=suggestion,
        )

    def _reduction_upstream(self, rank: int, value: str, depth: int = 12) -> Node | None:
        """The all-reduce a gradient output comes from through views, transposes and scalings."""
        nodes = self.rank_nodes[rank]
        node = nodes.get(value)
        for _ in range(depth):
            if node is None:
                return None
            if node.op == "all_reduce":
                return node
            if node.op not in ("view", "permute", "scalar") or not node.inputs:
                return None
            node = nodes.get(node.inputs[0])
        return None

    @staticmethod
    def _seed_losses(graph: Graph, nodes: dict[str, Node]) -> list[str]:
        """The losses a program runs backward from (what its `ones_like` seeds are shaped like)."""
        return [
            n.attrs["like"]
            for n in graph.nodes
            if n.op == "constant" and n.original.endswith("ones_like") and n.attrs.get("like") in nodes
        ]

    def _first_use(self, rank: int, parameter: str) -> Node | None:
        graph = self.ev.ranks[rank]
        placeholder = next((p.id for p in graph.placeholders if p.target == parameter), None)
        if placeholder is None:
            return None
        return next((n for n in graph.nodes if placeholder in n.inputs), None)

    def _gradient_of(self, index: int) -> str | None:
        roles = self.reference.gradient_roles
        role = roles[index] if index < len(roles) else None
        return role.parameter if role is not None else None

    def _output_name(self, index: int) -> str:
        parameter = self._gradient_of(index)
        return f"the gradient of `{parameter}`" if parameter else f"output {index}"

    def _output_expectation(self, index: int) -> str:
        if self._gradient_of(index):
            return "every rank holds the reference gradient whole, or the block of it its parameter holds"
        return "every rank returns the reference output (or the declared output relation)"

    def _output_suggestion(self, index: int, kind: str) -> str:
        if self._gradient_of(index) and kind == "missing-reduction":
            return "all-reduce this gradient over the ranks after backward (each rank's covers only its own part)"
        return "combine the ranks' results so that each returns the full output"

    def _with_output_picture(
        self, ref_value: str, rank: int, value: str, label: str, found: Discrepancy
    ) -> Discrepancy:
        """The reference's output and the rank's output side by side, each under the operation that
        feeds it (for a gathered output: the gather), linked by what the rank actually returns."""
        reference = [{**self._ref_row(ref_value, broken=True), "row": 1}]
        parallel = [{**self._rank_row(rank, value, broken=True), "row": 1}]
        edges: list[dict[str, Any]] = []
        ref_node, node = self.ref_nodes.get(ref_value), self.rank_node(rank, value)
        if ref_node is not None and ref_node.inputs:
            reference.insert(0, {**self._ref_row(ref_node.inputs[0]), "row": 0})
            edges.append({"column": "reference", "from": 0, "to": 1})
        if node is not None and node.inputs:
            parallel.insert(0, {**self._rank_row(rank, node.inputs[0]), "row": 0})
            edges.append({"column": "parallel", "from": 0, "to": 1})
        found.details.setdefault(
            "neighbourhood",
            {
                "rank": rank,
                "reference": reference,
                "parallel": parallel,
                "links": [{"row": 1, "label": label, "status": "broken"}],
                "edges": edges,
            },
        )
        return found

    def not_equivalent(self, ref_node: Node, rank: int, ranks: list[int]) -> Discrepancy | Unsupported:
        unsupported = self._unsupported(ref_node, rank)
        if unsupported is not None:
            return unsupported
        aligned = self.aligned(ref_node, rank)
        return Discrepancy(
            kind="not-equivalent",
            message=f"rank {rank} computes nothing equal or related to {self.ref_value_name(ref_node.id)}",
            primary=self.rank_site(aligned) if aligned else None,
            reference=self.ref_site(ref_node, "the reference computes this value here"),
            ranks=ranks,
            reference_node=ref_node.id,
            parallel_nodes=[f"rank{rank}/{aligned.id}"] if aligned else [],
            expected=f"a value related to {self.ref_value_name(ref_node.id)}",
            found="no related value",
        )


def blocked_tiling(ranges: list[tuple[int, int]], size: int | None = None) -> bool:
    """Ranges in rank order tile [0, size), each block possibly repeated by consecutive ranks."""
    blocks: list[tuple[int, int]] = []
    counts: list[int] = []
    for span in ranges:
        if blocks and blocks[-1] == span:
            counts[-1] += 1
        else:
            blocks.append(span)
            counts.append(1)
    if len(set(counts)) > 1:
        return False
    position = 0
    for start, end in blocks:
        if start != position or end <= start:
            return False
        position = end
    return size is None or position == size


def _walk(expr: px.Expr) -> list[px.Expr]:
    out = [expr]
    for child in px.children(expr):
        out.extend(_walk(child))
    return out


def explain(evidence: Evidence, failing_outputs: list[int]) -> Discrepancy | Unsupported:
    localizer = Localizer(evidence)
    return localizer.with_plan_context(localizer.with_library_context(localizer.explain(failing_outputs)))


__all__ = ["Evidence", "Placeholder", "blocked_tiling", "explain"]
