"""The localizer's context: the evidence and the questions every detector asks of it (which rank
value plays a reference value's part, what relations hold, where a node's line is)."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from ..graph.model import Frame, Node, SourceSite
from ..results import Discrepancy, Site, Unsupported
from ..verify.relations_found import Relation
from .assignments import Assignment
from .blame import Blame
from .evidence import Evidence
from .neighbourhood import Pictures
from .plans import Plans
from .sites import Line, library_site, line_of, pick_frame, reference_lines, to_site
from .wording import _LINEAR_OPS, _SUPPORTED, _fn, describe_op

# ops whose every output entry is one input entry (a view, a permutation, a broadcast, a slice):
# what they produce holds part of their input, element for element
INDEX_MAPS = ("view", "permute", "expand", "slice")


class Context(Blame, Pictures, Plans):
    """The evidence with its indexes (nodes, placeholders and consumers by value, per program), and
    the queries detectors share; walking back to a culprit (`Blame`), drawing the picture of a
    report (`Pictures`) and moving a plan mistake to its plan entry (`Plans`) are mixed in from
    their own modules."""

    def __init__(self, evidence: Evidence) -> None:
        self.ev = evidence
        self.index = evidence.index
        self.reference = evidence.reference
        self.ref_nodes = self.reference.node_map()
        self.ref_placeholders = {p.id: p for p in self.reference.placeholders}
        self.rank_nodes = [g.node_map() for g in evidence.ranks]
        self.rank_placeholders = [{p.id: p for p in g.placeholders} for g in evidence.ranks]
        self.rank_consumers = [g.consumers() for g in evidence.ranks]
        self.ref_consumers = self.reference.consumers()
        self.topo = {n.id: i for i, n in enumerate(self.reference.nodes)}
        self.ref_lines = reference_lines(self.reference)
        # user line -> the library frame it called into, for every rank site shown (related info)
        self.library_calls: dict[Line, Site] = {}

    def site_at(self, assigned: Assignment, note: str = "") -> Site:
        """A report site for an assignment found in the user's source (assignments.py)."""
        return Site(
            file=assigned.file,
            line=assigned.line,
            column=assigned.column + 1,
            end_line=assigned.end_line,
            end_column=assigned.end_column + 1,
            code=assigned.code,
            note=note,
        )

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

    def relations_between(self, ref_value: str, rank: int, value: str) -> list[Relation]:
        return [rel for rel, values in self.index.relations(ref_value, rank) if value in values]

    def is_related(self, rank: int, value: str) -> bool:
        return bool(self.index.relations_of_rank_value(rank, value))

    def ref_value_name(self, value: str) -> str:
        """`the output of linear layers.0.attention.wo`, `layers.0.attention.wo.bias`."""
        if value in self.ref_placeholders:
            placeholder = self.ref_placeholders[value]
            if placeholder.kind == "input":  # its target is the argument's position ("0", "0.tokens")
                return f"input {placeholder.target} of the forward"
            return placeholder.target
        node = self.ref_nodes.get(value)
        if node is None:
            return value
        where = f" in {node.module_path}" if node.module_path and node.op not in ("linear", "embedding") else ""
        return f"the output of {describe_op(node)}{where}"

    def ref_value_names(self, *values: str) -> list[str]:
        """The names of reference values one message mentions; two different values the names
        would describe alike (two `logical_not`s) are told apart by their lines."""
        names = [self.ref_value_name(v) for v in values]
        told = []
        for value, name in zip(values, names, strict=True):
            node = self.ref_nodes.get(value)
            alike = any(other != value and names[i] == name for i, other in enumerate(values))
            site = self.ref_site(node) if alike and node is not None else None
            told.append(f"{name} (at {site.short()})" if site is not None else name)
        return told

    def aligned(self, ref_node: Node, rank: int) -> Node | None:
        """The rank node that plays the part of `ref_node`: same op, inputs related to its inputs."""
        related_inputs = self._related_to_inputs(ref_node, rank)
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
        # A movement that is itself related to a reference value (a permuted layout's transpose)
        # plays that value's part, not this one's.
        if len(ref_node.inputs) == 1:
            for node in self.ev.ranks[rank].nodes:
                reads_related = bool(node.inputs) and any(node.inputs[0] in s for s in related_inputs)
                moves = node.op in INDEX_MAPS
                if reads_related and moves and not self.is_related(rank, node.id):
                    return node
        return by_name

    def departure(self, ref_node: Node, rank: int, ahead: set[str] | None = None) -> Node | None:
        """The rank's first value (in graph order) that reads a value related to an input of
        `ref_node`, has no relation of its own and leads to none: where its computation stops
        following the reference's, when no node plays `ref_node`'s part (`aligned`). A value whose
        results are related again (the rank's own mask of its vocabulary shard, read by a pick
        that is the reference's) is a step of the rank's way to a reference value, not a
        departure from it."""
        related = {
            v for value in ref_node.inputs for _, vals in self.index.relations(value, rank, every=True) for v in vals
        }
        rejoins = self._rejoining(rank) - self._reaching_outputs_unrelated(rank)
        for node in self.ev.ranks[rank].nodes:
            if not any(v in related for v in node.inputs) or node.id in rejoins:
                continue
            if not self._related_within(rank, node.id, ahead):
                return node
        return None

    def other_op_on_same_values(self, ref_node: Node, rank: int, node: Node) -> bool:
        """Whether the rank's `node` is an op of `ref_node`'s kind with another function (`>=`
        where the reference has `>`) applied to values related alike to `ref_node`'s inputs."""
        if node.op != ref_node.op or _fn(node) == _fn(ref_node) or len(node.inputs) != len(ref_node.inputs):
            return False
        related = self._related_to_inputs(ref_node, rank)
        return all(v in values for v, values in zip(node.inputs, related, strict=True))

    def _related_to_inputs(self, ref_node: Node, rank: int) -> list[set[str]]:
        """Per input of `ref_node`, the rank values related to it."""
        return [{v for _, vals in self.index.relations(value, rank) for v in vals} for value in ref_node.inputs]

    def _related_within(self, rank: int, value: str, ahead: set[str] | None) -> bool:
        """Whether a rank value is related to a reference value (one of `ahead`, when given: a
        rank value related only to what the reference computes before does not follow it)."""
        found = self.index.relations_of_rank_value(rank, value)
        return any(set(refs) & ahead for _, refs in found) if ahead is not None else bool(found)

    def consumers_in_reference(self, value: str, transitively: bool = False) -> list[Node]:
        """The reference's nodes that read `value` (or, `transitively`, any value computed from
        it), in graph order."""
        users, frontier = set(self.ref_consumers.get(value, [])), list(self.ref_consumers.get(value, []))
        while transitively and frontier:
            for user in self.ref_consumers.get(frontier.pop(), []):
                if user not in users:
                    users.add(user)
                    frontier.append(user)
        return [self.ref_nodes[c] for c in sorted(users, key=self.topo.__getitem__)]

    def _rejoining(self, rank: int) -> set[str]:
        """The rank's values from which a related value is computed (in graph order, backwards)."""
        nodes = self.ev.ranks[rank].nodes
        rejoins: set[str] = set()
        for node in reversed(nodes):
            if node.id in rejoins or self.is_related(rank, node.id):
                rejoins.update(node.inputs)
        return rejoins

    def _reaching_outputs_unrelated(self, rank: int) -> set[str]:
        """The rank's unrelated values from which an output is computed through unrelated values
        only: such a value changes what the rank returns even when another of its uses rejoins
        the reference (a band mask whose fully masked rows are the reference's, used to mask
        the scores too)."""
        graph = self.ev.ranks[rank]
        reaching = {v for v in graph.outputs if not self.is_related(rank, v)}
        for node in reversed(graph.nodes):
            if node.id in reaching or self.is_related(rank, node.id):
                continue
            if any(c in reaching for c in self.rank_consumers[rank].get(node.id, [])):
                reaching.add(node.id)
        return reaching

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

    def _holding(self, rel: Relation, ref_value: str, name: str | None = None) -> str:
        shape = self._shape(ref_value)
        name = self.ref_value_name(ref_value) if name is None else name
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
        from ..verify.opaque_rules import opaque_ops

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
            message=f"no rule relates {describe_op(ref_node)} on sharded or partial inputs; the check cannot "
            f"follow the parallel computation past it",
            op=describe_op(ref_node),
            site=self.ref_site(ref_node),
        )

    def _is_replicated(self, rank: int, value: str) -> bool:
        c = self.index.class_of(f"rank{rank}", value)
        return c is not None and self.index.has_reference_member(c)

    def _is_constant_like(self, rank: int, value: str) -> bool:
        node = self.rank_node(rank, value)
        return node is not None and node.op in ("constant",)

    def factor(self, graph: str, value: str) -> Fraction:
        return self.ev.factors.get((graph, value), Fraction(1))

    def first_broken(self, rank: int, failing_ids: list[str]) -> str | None:
        if self.ev.outputs_of is not None:
            # a pipeline: earlier stages compute the reference's earlier values on other ranks
            everywhere = range(len(self.ev.ranks))
            unrelated = {n.id for n in self.reference.nodes if not any(self.index.related(n.id, r) for r in everywhere)}
        else:
            unrelated = {n.id for n in self.reference.nodes if not self.index.related(n.id, rank)}
            unrelated -= self._reshaped_related(unrelated)
            unrelated -= self._computed_elsewhere(rank, unrelated)
        harmful = _back_from(
            [o for o in failing_ids if o in unrelated], self.ref_nodes, lambda value: value in unrelated
        )
        for node in self.reference.nodes:
            if node.id in harmful and not any(i in harmful for i in node.inputs):
                return node.id
        return None

    def _reshaped_related(self, unrelated: set[str]) -> set[str]:
        """Reference values that hold the numbers of a related value: one side of a view that only
        inserts or removes size-1 dims (a reduction with its dim kept, and without). A rank that
        computes the max with `keepdim=True` relates the reference's kept view of its max, not the
        max itself; that is not where it breaks."""
        same: set[str] = set()
        for node in self.reference.nodes:
            if node.op != "view" or len(node.inputs) != 1:
                continue
            source = node.inputs[0]
            if (source in unrelated) == (node.id in unrelated):
                continue
            shapes = [self.reference.meta_of(v).shape for v in (source, node.id)]
            if [n for n in shapes[0] if n != 1] == [n for n in shapes[1] if n != 1]:
                same.add(source if source in unrelated else node.id)
        return same

    def _computed_elsewhere(self, rank: int, unrelated: set[str]) -> set[str]:
        """Reference values this rank does not compute by design (expert parallelism: rank 1 runs
        expert 2 where the reference's first expert is rank 0's): another rank computes the value
        and combines it as the reference does (`_combined_on`), and this rank's operation in its
        place computes another reference value; and the values another rank computes from such
        values alone (with what this rank does relate). Not broken here: the rank's own mistake is
        elsewhere. A fused weight cut as one block differs: there the rank that holds the value
        does not combine it right (gate and up each whole on one rank, their product on none)."""
        others = [r for r in range(len(self.ev.ranks)) if r != rank]
        candidates = {v for v in unrelated if any(self.index.related(v, r) for r in others)}
        if not candidates or len(candidates) > _MOST_ELSEWHERE:
            return set()  # nothing another rank computes; or too many to align one by one
        consumers = self.reference.consumers()
        elsewhere: set[str] = set()
        for node in self.reference.nodes:
            if node.id not in candidates:
                continue
            holders = [r for r in others if self._combined_on(node.id, r, consumers)]
            if not holders:
                continue  # a value no rank computes and combines right is broken wherever it is needed
            missing = [i for i in node.inputs if i in unrelated]
            if missing and all(i in elsewhere for i in missing):
                elsewhere.add(node.id)
                continue
            counterpart = self.aligned(node, rank)
            if counterpart is not None and self.is_related(rank, counterpart.id):
                elsewhere.add(node.id)
        return elsewhere

    def _combined_on(self, value: str, rank: int, consumers: dict[str, list[str]]) -> bool:
        """Whether `rank` holds `value` whole and carries it, through operations of it alone, to
        the reference's first combination of it with another value, related there too (or to an
        output). Whole: a rank holding a block of a value (tensor parallelism) leaves the other
        blocks to no one; each rank must compute its own."""
        if not any(rel.kind == "equal" for rel, _ in self.index.relations(value, rank)):
            return False
        outputs = set(self.reference.outputs)
        current = value
        for _ in range(64):
            if not self.index.related(current, rank):
                return False
            if current in outputs:
                return True
            following = consumers.get(current, [])
            combined = [c for c in following if len(set(self.ref_nodes[c].inputs)) > 1]
            if combined:
                if all(self.index.related(c, rank) for c in combined):
                    return True
                # or the rank hands its value to a reduction over the ranks, which does the
                # combining (an expert-parallel rank's sum over its own experts)
                held = [v for _, values in self.index.relations(current, rank) for v in values]
                return any(self.downstream_all_reduce(rank, v) is not None for v in held)
            if len(following) != 1:
                return bool(following) and all(self.index.related(c, rank) for c in following)
            current = following[0]
        return False

    def first_broken_alone(self, rank: int, failing_ids: list[str]) -> str | None:
        """The first value the failing outputs depend on that `rank` does not compute though another
        rank does, from inputs `rank` computes (its counterpart on `rank` is the mistake)."""
        others = [r for r in range(len(self.ev.ranks)) if r != rank]
        if not others:
            return None
        ancestors = _back_from(failing_ids, self.ref_nodes, lambda _value: True)
        # the rank's own values the failure flows through: back from its outputs, through values
        # with no relation (a rank value a relation explains is not where its output goes wrong)
        graph = self.ev.ranks[rank]
        outputs = {self.reference.outputs.index(o) for o in failing_ids if o in self.reference.outputs}
        tainted = _back_from(
            [graph.outputs[i] for i in outputs if i < len(graph.outputs)],
            self.rank_nodes[rank],
            lambda value: not self.is_related(rank, value),
        )
        for node in self.reference.nodes:
            if node.id not in ancestors or self.index.related(node.id, rank):
                continue
            if not any(self.index.related(node.id, r) for r in others):
                continue
            if not all(self.index.related(i, rank) for i in node.inputs if i in self.ref_nodes):
                continue
            counterpart = self.aligned(node, rank)
            if counterpart is not None and counterpart.id in tainted:
                return node.id
        return None

    def _gradient_of(self, index: int) -> str | None:
        roles = self.reference.gradient_roles
        role = roles[index] if index < len(roles) else None
        return role.parameter if role is not None else None


# How many values another rank computes are looked at one by one (`_computed_elsewhere` aligns each
# with the rank's operations: quadratic in the graph); a larger program keeps the plain rule.
_MOST_ELSEWHERE = 500


def _back_from(start: list[str], nodes: dict[str, Node], follows: Callable[[str], bool]) -> set[str]:
    """`start` and every value reached backwards from it through inputs that `follows` accepts."""
    reached: set[str] = set()
    stack = list(start)
    while stack:
        value = stack.pop()
        if value in reached:
            continue
        reached.add(value)
        node = nodes.get(value)
        if node is not None:
            stack.extend(i for i in node.inputs if follows(i))
    return reached
