"""Walking back from a wrong rank value to the line that introduced it: through the rank's graph,
into parameter provenance (the slice taken per rank), or to the line that handed a value on."""

from __future__ import annotations

from collections.abc import Callable

from ..graph.model import Frame, Node
from ..graph.numbers import NumberStep
from ..relations import expr as px
from ..results import Site
from ..verify.relations_found import Relation
from .kept_numbers import kept_factor, kept_number
from .sites import Line, line_of, pick_frame, to_site
from .wording import describe_op


class Blame:
    """Mixed into `Context` (context.py): `self` is the localizer's context."""

    def blame(
        self, rank: int, value: str, depth: int = 0, suspects: frozenset[str] = frozenset()
    ) -> tuple[Site | None, str]:
        """Walk back from a wrong rank value to where its wrongness was introduced (`suspects`:
        parameters whose cuts are known wrong, so their lines are never innocent)."""
        if depth > 40:
            return None, "depth"
        if value in self.rank_placeholders[rank]:
            return self.provenance_blame(rank, value, suspects)
        node = self.rank_node(rank, value)
        if node is None:
            return None, "unknown"
        if node.op == "generic" and not self._followed(node):
            return self.rank_site(node), f"unsupported:{describe_op(node)}"
        if node.op in ("slice", "cat", "view", "permute", "expand") and self._varies_across_ranks(rank, node):
            return self.rank_site(node, "this slice differs between ranks"), "rank-dependent-slice"
        unrelated_inputs = [
            v for v in node.inputs if not self.is_related(rank, v) and not self._is_constant_like(rank, v)
        ]
        if not unrelated_inputs and self._cuts_a_shard_otherwise(rank, node):
            # the rank's proper shard (its blocks tile the reference's value) cut into pieces the
            # reference never takes of it (a per-head [q; k; v] layout split as one [q; k; v]):
            # the cut is the mistake, not the loader that made the shard
            return self.rank_site(node, "this cut splits a proper shard otherwise than the reference"), "cut-of-shard"
        if unrelated_inputs:
            producer = self.rank_node(rank, unrelated_inputs[0])
            if producer is not None and producer.collective is not None and producer.collective.kind == "all_gather":
                # A gathered buffer (the ranks' pieces stacked along dim 0) is rarely a value the
                # reference has; what this op makes of it is where a wrong regrouping happens.
                return self.rank_site(node), "after-gather"
            return self.blame(rank, unrelated_inputs[0], depth + 1, suspects)
        if self._scatters_selection(rank, node):
            # Contiguous pieces joined into a scattered selection (tiled instead of interleaved
            # heads): related, but in a layout the reference never has. Formed here.
            return self.rank_site(node, "the pieces are joined in this order here"), "layout"
        if node.op in ("scalar", "unary") and len(node.inputs) == 1 and not self.is_related(rank, node.id):
            # an elementwise op of one value keeps whatever relation its input has (a block stays
            # that block): a related input and an unrelated result is the op itself (a wrong
            # factor, an op the reference does not apply there), not where the input came from
            return self._kept_factor_site(rank, node) or self.rank_site(node), "node"
        if self._reduces_blocks(rank, node):
            # an all-reduce adds what the ranks hold; blocks of one value (a head's output, a
            # sequence shard) are not parts of a sum: the reduction is in the wrong place
            return self.rank_site(node, "this reduction adds the ranks' blocks of a value"), "reduced-blocks"
        sharded = [v for v in node.inputs if not self._is_replicated(rank, v)]
        if sharded:
            return self.blame(rank, sharded[-1], depth + 1, suspects)
        return self.rank_site(node), "node"

    def _reduces_blocks(self, rank: int, node: Node) -> bool:
        """A sum-reduction (all-reduce, reduce-scatter) whose input holds a block of a reference
        value, not a partial sum, and whose result is related to nothing."""
        if node.op not in ("all_reduce", "reduce_scatter") or node.collective is None:
            return False
        if node.collective.reduce_op != "sum" or self.is_related(rank, node.id) or not node.inputs:
            return False
        kinds = {rel.kind for rel, _ in self.index.relations_of_rank_value(rank, node.inputs[0])}
        return kinds == {"sel"}

    def _kept_factor_site(self, rank: int, node: Node) -> Site | None:
        """Where the factor of a wrong scaling was computed, when the forward reads it from a
        number the builder kept (`q * self.scaling`) and that number was computed from the world
        size (a rank's share of a size where the whole size belongs): the computation, not the use."""
        used = node.attrs.get("value")
        frame = self.rank_frame(node)
        if node.op != "scalar" or not isinstance(used, int | float) or not used or frame is None:
            return None

        return _computed_from_world_size(kept_factor(node.site, frame, self.ev.rank_numbers[rank], float(used)))

    def kept_size_site(self, rank: int, node: Node) -> Site | None:
        """Where a size of a view's shape was computed, when the forward reads it from a number
        the builder kept and computed from the world size (a group size set to the local width):
        the computation, not the view (which may be a helper shared with the reference)."""
        shape = node.attrs.get("shape")
        frame = node.site.innermost if node.site is not None else None
        if node.op != "view" or not isinstance(shape, list) or frame is None:
            return None
        sizes = {float(size) for size in shape}
        return _computed_from_world_size(
            kept_number(node.site, frame, self.ev.rank_numbers[rank], lambda value: value in sizes)
        )

    def _scatters_selection(self, rank: int, node: Node) -> bool:
        """The node holds a selection of several ranges although each input is one range."""

        def widest(value: str) -> int:
            rels = [rel for rel, _ in self.index.relations_of_rank_value(rank, value) if rel.kind == "sel"]
            return min((len(rel.ranges) for rel in rels), default=0)

        if node.op != "cat" or widest(node.id) < 2:
            return False
        return all(widest(v) == 1 for v in node.inputs)

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

    def _cuts_a_shard_otherwise(self, rank: int, node: Node) -> bool:
        """A slice of the rank's block of a reference value (blocks that tile it across the ranks)
        whose pieces do not tile it, along a dim the reference never slices that value along."""
        dim = node.attrs.get("dim")
        if node.op != "slice" or len(node.inputs) != 1 or not isinstance(dim, int):
            return False
        source = node.inputs[0]
        ndim = len(self.ev.ranks[rank].meta_of(source).shape)
        for rel, refs in self.index.relations_of_rank_value(rank, source):
            if rel.kind != "sel" or len(rel.ranges) != 1 or rel.dim % ndim != dim % ndim:
                continue
            for ref in refs:
                shard = self._ranges_across_ranks(source, ref)
                piece = self._ranges_across_ranks(node.id, ref)
                if shard is None or not blocked_tiling(shard) or (piece is not None and blocked_tiling(piece)):
                    continue
                sliced_alike = any(
                    self.ref_nodes[c].op == "slice" and self.ref_nodes[c].attrs.get("dim", 0) % ndim == dim % ndim
                    for c in self.ref_consumers.get(ref, [])
                )
                if not sliced_alike:
                    return True
        return False

    def _ranges_across_ranks(self, value: str, ref: str) -> list[tuple[int, int]] | None:
        """Per rank, the one range of `ref` the rank's `value` (the same node on every rank) holds."""
        ranges = []
        for r in range(len(self.ev.ranks)):
            held = [
                rel.ranges[0]
                for rel, refs in self.index.relations_of_rank_value(r, value)
                if rel.kind == "sel" and len(rel.ranges) == 1 and ref in refs
            ]
            if not held:
                return None
            ranges.append(held[0])
        return ranges

    def provenance_site(self, rank: int, value: str) -> Site | None:
        site, _ = self.provenance_blame(rank, value)
        return site

    def provenance_blame(
        self, rank: int, value: str, suspects: frozenset[str] = frozenset()
    ) -> tuple[Site | None, str]:
        placeholder = self.rank_placeholders[rank][value]
        expr = self.ev.rank_values[rank].get(placeholder.target)
        if expr is None:
            return None, "provenance"
        problems = px.problems(expr)
        if problems:
            leaf = problems[0]
            return to_site(pick_frame(leaf.site, self.ref_lines)), "unrelated-parameter"
        # (its own slice tiling its source proves nothing: a fused weight cut as one block tiles it)
        innocent = self._consistent_provenance_lines(besides={placeholder.target, *suspects})
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

    def _consistent_provenance_lines(self, besides: set[str] | None = None) -> set[Line]:
        """Lines that made correctly tiled slices for some parameter not in `besides`:
        helpers, innocent."""
        lines: set[Line] = set()
        targets = set(self.ev.rank_values[0]) if self.ev.rank_values else set()
        for target in targets - (besides or set()):
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
        per_part = [
            s for s in scored if self._tiles_per_part(s[2], aligned, s[1]) and self._parts_from_a_parameter(rank, s[3])
        ]
        if per_part and len(per_part) < len(scored):
            # One input holds every part's block (a fused [q; k; v] cut part by part) and another
            # one contiguous block of the fused dim: the block is the one that ignores the parts.
            blocks = [s for s in scored if s not in per_part and s[0]]
            if blocks:
                return [(k, ref_value, value) for _, k, ref_value, value in blocks], False
        # an input the ranks' selections tile (as one block each, or a block of every part) is a
        # proper shard; one that two ranks hold alike (a per-rank table sliced from 0 on every
        # rank) is what does not fit
        proper = [s for s in scored if s[0] or self._tiles_per_part(s[2], aligned, s[1])]
        anchors = proper
        suspects = [s for s in scored if s not in proper]
        if anchors and suspects:
            return [(k, ref_value, value) for _, k, ref_value, value in suspects], False
        # Every input is a proper shard but they do not combine (a sequence shard meeting a
        # vocabulary-sharded weight): a parameter's shard is the loader's deliberate layout, so
        # the computed input that reached the op in the wrong layout is blamed first.
        if not scored or not all(tiles for tiles, *_ in scored):
            return [(k, ref_value, value) for _, k, ref_value, value in scored[-1:]], False
        computed = [s for s in scored if self.is_parameter_value(rank, s[3]) is None]
        return [(k, ref_value, value) for _, k, ref_value, value in (computed or scored)[-1:]], True

    def _parts_from_a_parameter(self, rank: int, value: str, depth: int = 8) -> bool:
        """Whether a value's several ranges come from a parameter loaded part by part (the
        loader's deliberate layout), not from copies joined in the program (a tiled repeat)."""
        frontier = [value]
        for _ in range(depth):
            following = []
            for v in frontier:
                if v in self.rank_placeholders[rank]:
                    rels = [rel for rel, _ in self.index.relations_of_rank_value(rank, v) if rel.kind == "sel"]
                    if any(len(rel.ranges) > 1 for rel in rels):
                        return True
                    continue
                node = self.rank_node(rank, v)
                if node is None or node.op in ("cat", "expand") or node.op.startswith("all_"):
                    continue  # pieces joined here: the program's layout, not a loaded one
                following.extend(node.inputs)
            frontier = following
        return False

    def _held_across_ranks(
        self, ref_value: str, aligned: Node, position: int, kept: Callable[[Relation], bool]
    ) -> list[Relation] | None:
        """Per rank, the first relation `kept` accepts between the reference's input and the
        input at `position` of that rank's counterpart of `aligned` (None when a rank has none)."""
        held = []
        for r in range(len(self.ev.ranks)):
            counterpart = next((n for n in self.ev.ranks[r].nodes if n.id == aligned.id), None)
            if counterpart is None or position >= len(counterpart.inputs):
                return None
            rels = [rel for rel in self.relations_between(ref_value, r, counterpart.inputs[position]) if kept(rel)]
            if not rels:
                return None
            held.append(rels[0])
        return held

    def _tiles_per_part(self, ref_value: str, aligned: Node, position: int) -> bool:
        """Do the ranks' selections of this input take, in every one of several parts of a dim, the
        blocks that tile that part in rank order (a fused weight cut part by part)?"""
        held = self._held_across_ranks(
            ref_value, aligned, position, lambda rel: rel.kind == "sel" and len(rel.ranges) > 1
        )
        if held is None:
            return False
        per_rank = [rel.ranges for rel in held]
        parts = {len(ranges) for ranges in per_rank}
        if len(parts) != 1:
            return False
        position_in_dim = 0
        for part in range(parts.pop()):
            blocks = [ranges[part] for ranges in per_rank]
            if blocks[0][0] != position_in_dim or not blocked_tiling(
                [(s - blocks[0][0], e - blocks[0][0]) for s, e in blocks]
            ):
                return False
            position_in_dim = blocks[-1][1]
        return True

    def _tiles_across_ranks(self, ref_value: str, aligned: Node, position: int) -> bool:
        """Do the ranks' selections of this input tile it in rank order (allowing replicated blocks)?"""
        held = self._held_across_ranks(ref_value, aligned, position, lambda rel: rel.kind in ("sel", "psum"))
        if held is None:
            return False
        spans: list[tuple[int, int, int]] = []
        for rel in held:
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


def _computed_from_world_size(kept: tuple[NumberStep, str] | None) -> Site | None:
    """Where a kept number was computed, when it was computed from the world size."""
    if kept is None:
        return None
    step, name = kept
    if step.frame is None or not any(s.op == "world size" for s in step.ancestors()):
        return None
    return to_site(step.frame, f"{name} is computed here, from this rank's share of a size")
