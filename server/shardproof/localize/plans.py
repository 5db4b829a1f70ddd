"""A plan mistake is reported at its plan entry, whatever the planned module's class.

A DTensor plan (torch's `parallelize_module`, a transformers `tp_plan`) decides the layout of
every activation that crosses a planned module's boundary: its hooks redistribute the module's
inputs and outputs to the layouts its entry declares, inserting the collectives. Three laws
move a report from the line the localizer blamed to a plan entry:

1. What runs inside a planned module that the user did not write (a torch `nn.Linear`) and the
   collectives a plan's hooks insert are the plan's doing: the entry is where to change them.
2. A value's layout as it leaves a planned module is what that module's entry made it. Code the
   parallel program shares with its reference computes the reference's function on whatever
   layout it is handed, so when the culprit value is reached from a planned module's output
   through such code only (data movement, or an op along its inputs that are not whole), the one
   thing that differs from the reference on that path is the layout the plan chose: its entry is
   what to change, the outermost planned module the value leaves having had the last word.
   A data-movement op that makes a layout itself (joins contiguous pieces into a scattered
   selection, slices differently per rank) and any line the reference does not run stop the
   walk: they are the localizer's own findings.
3. An entry that *claims* a layout which the proven relation of its value contradicts is false
   (DTensor takes `input_layouts`, and PrepareModuleOutput's `output_layouts`, on trust, so the
   value leaves the module in another layout than the entry declares), and it is the culprit
   before any entry that merely asks for a layout its value truly has.

Detectors name the value they found wrong in `details["culprit"]` (`rank0/<value>`); without
it, a report whose operation ran inside a planned torch module is moved by law 1 alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..graph.model import Frame, Graph, Node, PlanLayouts
from ..results import Discrepancy, Site, Unsupported
from .sites import line_of, to_site

_MOVEMENT = ("view", "permute", "expand", "slice", "cat")
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True)
class Crossing:
    """Where a culprit's layout was decided by a plan: `node` (value `value`) leaves the planned
    modules `paths` (outermost first) towards `consumer` (None: it is a program output), or, when
    `inside`, is an op of the plan inside the planned module `paths[0]`."""

    value: str
    node: Node
    paths: tuple[str, ...]
    consumer: Node | None
    inside: bool = False


@dataclass(frozen=True)
class FalseClaim:
    """An entry's declared layout (`declared`) of one of its module's activations (`role`: its
    input or its output) that the value's proven relation (`holds`, as a layout) contradicts."""

    role: str
    declared: str
    holds: str


class Plans:
    """Mixed into `Context` (context.py): `self` is the localizer's context."""

    def with_plan_context(self, found: Discrepancy | Unsupported) -> Discrepancy | Unsupported:
        if not isinstance(found, Discrepancy) or found.primary is None:
            return found
        if self._moved_to_crossing(found):
            return found
        self._moved_from_torch_module(found)
        return found

    # -- law 1 alone: the report's operation ran inside a planned torch module ------------------------
    def _moved_from_torch_module(self, found: Discrepancy) -> None:
        graphs = {graph.name: graph for graph in self.ev.ranks}
        for reference in found.parallel_nodes:
            graph_name, _, node_id = reference.partition("/")
            graph = graphs.get(graph_name)
            node = self.rank_node(graph.rank, node_id) if graph is not None and graph.rank is not None else None
            if node is None or not node.module_type.startswith("torch."):
                continue
            entry = graph.plan_entries.get(node.module_path)
            if entry is None:
                continue
            runs_here = replace(found.primary, note=found.primary.note or f"`{node.module_path}` runs here")
            found.primary = to_site(entry, f"the plan parallelizes `{node.module_path}` with {entry.function}")
            found.related.insert(0, runs_here)
            found.suggestion = f"{found.suggestion} (in the plan entry for `{node.module_path}`: its layouts)".lstrip()
            return

    # -- laws 1 to 3 from the culprit value ------------------------------------------------------------
    def _moved_to_crossing(self, found: Discrepancy) -> bool:
        culprit = str(found.details.get("culprit", ""))
        graph_name, _, value = culprit.partition("/")
        graph = next((g for g in self.ev.ranks if g.name == graph_name), None)
        if graph is None or graph.rank is None or not graph.plan_entries or not self._shared_line(found.primary):
            return False
        crossing = self.plan_crossing(graph.rank, value)
        if crossing is None:
            return False
        path, claim = self._deciding_entry(graph, crossing)
        entry = graph.plan_entries[path]
        layouts = graph.plan_layouts.get(path)
        used_here = replace(found.primary, note=found.primary.note or "the value is used here")
        runs = to_site(self._frame_running(crossing), f"`{path}` runs here")
        shown = [runs] if runs is not None else []
        if runs is None or (runs.file, runs.line, runs.column) != (used_here.file, used_here.line, used_here.column):
            shown.append(used_here)
        found.primary = to_site(entry, _entry_note(path, entry, layouts, claim))
        found.related[:0] = shown
        found.suggestion = f"{found.suggestion} ({_entry_advice(path, layouts, crossing, claim)})".lstrip()
        found.details["plan_entry"] = {"module": path, "style": entry.function, "declares": _declared(layouts)}
        if claim is not None:
            found.details["plan_entry"]["false_claim"] = {
                "role": claim.role,
                "declared": claim.declared,
                "holds": claim.holds,
            }
        return True

    def _shared_line(self, site: Site) -> bool:
        """Whether the localizer's site is code the reference runs too (its fallback: no line of
        the parallel program's own was found guilty)."""
        return (site.file, site.line) in self.ref_lines

    def plan_crossing(self, rank: int, value: str) -> Crossing | None:
        """Where the plan decided the layout of `value` (laws 1 and 2), if it did."""
        graph = self.ev.ranks[rank]
        consumers = [self.rank_nodes[rank][c] for c in self.rank_consumers[rank].get(value, [])]
        return self._crossing(rank, graph, value, None if value in graph.outputs else consumers, 0, {})

    def _crossing(
        self,
        rank: int,
        graph: Graph,
        value: str,
        used_by: list[Node] | None,
        depth: int,
        walked: dict[tuple[str, str], Crossing | None],
    ) -> Crossing | None:
        """`used_by`: the nodes the walk came from (None: the value leaves the program);
        `walked`: the answers so far, by value and the module it was used in."""
        key = (value, "\n".join(sorted(u.module_path for u in used_by)) if used_by is not None else "\n<output>")
        if key not in walked:
            walked[key] = None  # (a cycle is no crossing)
            walked[key] = self._crossing_once(rank, graph, value, used_by, depth, walked)
        return walked[key]

    def _crossing_once(
        self,
        rank: int,
        graph: Graph,
        value: str,
        used_by: list[Node] | None,
        depth: int,
        walked: dict[tuple[str, str], Crossing | None],
    ) -> Crossing | None:
        node = self.rank_node(rank, value)
        if node is None or depth > 40:
            return None
        planned = [p for p in graph.plan_entries if _inside(node.module_path, p)]
        left = sorted(
            (p for p in planned if used_by is None or any(not _inside(u.module_path, p) for u in used_by)), key=_depth
        )
        if left:
            outside = [u for u in used_by or [] if not _inside(u.module_path, left[-1])]
            return Crossing(value, node, tuple(left), outside[0] if outside else None)
        consumer = used_by[0] if used_by else None
        if not self._innocent(node) or (node.op == "cat" and self._scatters_selection(rank, node)):
            return None
        rank_dependent = node.op in _MOVEMENT and self._varies_across_ranks(rank, node)
        if planned:
            owner = max(planned, key=_depth)
            library_module = node.module_path == owner and node.module_type.startswith("torch.")
            if library_module or node.op in _COLLECTIVES or rank_dependent:
                return Crossing(value, node, (owner,), consumer, inside=True)
        if rank_dependent or node.op in _COLLECTIVES:
            return None  # (a collective outside planned modules is the program's own)
        found = [self._crossing(rank, graph, v, [node], depth + 1, walked) for v in self._layout_inputs(rank, node)]
        if not found or any(c is None for c in found) or len({c.paths for c in found if c is not None}) != 1:
            return None
        return found[0]

    def _layout_inputs(self, rank: int, node: Node) -> list[str]:
        """The inputs whose layout an op's output has: what data movement moves; else the inputs
        that are not whole (a whole input is the same on every rank, as in the reference), or,
        when all are whole, the ones computed in the program (not its inputs or parameters)."""
        data = [v for v in node.inputs if not self._is_constant_like(rank, v)]
        if node.op in _MOVEMENT:
            return data
        return [v for v in data if not self._is_replicated(rank, v)] or [
            v for v in data if self.rank_node(rank, v) is not None
        ]

    def _innocent(self, node: Node) -> bool:
        """Every user line of the node's call is one the reference runs too (library lines are the
        library's; a node without a user frame ran in library code)."""
        if node.site is None:
            return True
        return all(f.library is not None or line_of(f) in self.ref_lines for f in node.site.frames)

    def _deciding_entry(self, graph: Graph, crossing: Crossing) -> tuple[str, FalseClaim | None]:
        """Law 3, then law 2: the outermost entry with a false claim, else the outermost entry
        that declares how its output leaves (an entry that only prepares inputs has no say)."""
        rank = graph.rank or 0
        for path in crossing.paths:
            claim = self.false_claim(rank, path, None if crossing.inside else crossing.value)
            if claim is not None:
                return path, claim
        declaring = [p for p in crossing.paths if _declares_output(graph.plan_layouts.get(p))]
        return (declaring or list(crossing.paths))[0], None

    def false_claim(self, rank: int, path: str, leaving: str | None) -> FalseClaim | None:
        """The entry for `path` declares a layout its value contradicts: the value `leaving` the
        module (if given) is not in the layout the entry hands its output on with (DTensor
        redistributes a true claim faithfully), or the one input it claims a layout for is not in
        that layout."""
        graph = self.ev.ranks[rank]
        layouts = graph.plan_layouts.get(path)
        if layouts is None:
            return None
        if leaving is not None and _one_output(layouts):
            holds = self.layouts_held(rank, leaving)
            if holds and _normal(layouts.outputs[0], graph, leaving) not in holds:
                declared = layouts.output_claims[0] if layouts.output_claims else layouts.outputs[0]
                return FalseClaim("output", declared or layouts.outputs[0], sorted(holds)[0])
        claims = [c for c in layouts.input_claims if c is not None]
        entering = self._entering(rank, path)
        if len(claims) == 1 and len(entering) == 1:
            holds = self.layouts_held(rank, entering[0])
            if holds and _normal(claims[0], graph, entering[0]) not in holds:
                return FalseClaim("input", claims[0], sorted(holds)[0])
        return None

    def layouts_held(self, rank: int, value: str) -> set[str]:
        """The layouts a rank value is proven to have, in a plan's words: `Replicate()` for a value
        equal to a reference value, `Shard(d)` for a slice along dim d (d counted from the last),
        `Partial()` for a partial sum; `scaled` for a multiple (no layout at all)."""
        held: set[str] = set()
        for rel, _ in self.index.relations_of_rank_value(rank, value):
            if rel.kind == "equal":
                held.add("Replicate()")
            elif rel.kind == "sel":
                held.add(f"Shard({rel.dim})")
            elif rel.kind == "psum":
                held.add("Partial()")
            elif rel.kind == "pmax":
                held.add('Partial("max")')
            elif rel.kind == "frac":
                held.add("scaled")
        return held

    def _entering(self, rank: int, path: str) -> list[str]:
        """The activations that enter a module: read inside it, made outside it (or program inputs)."""
        entering: list[str] = []
        for node in self.ev.ranks[rank].nodes:
            if not _inside(node.module_path, path):
                continue
            for v in node.inputs:
                placeholder = self.rank_placeholders[rank].get(v)
                producer = self.rank_node(rank, v)
                outside = (placeholder is not None and placeholder.kind == "input") or (
                    producer is not None and not _inside(producer.module_path, path) and producer.op != "constant"
                )
                if outside and v not in entering:
                    entering.append(v)
        return entering

    def _frame_running(self, crossing: Crossing) -> Frame | None:
        """The user line that runs the planned module: for a library module (an `nn.Linear`, whose
        forward has no user line) the op's innermost user frame; for the user's own class the
        deepest frame the op inside it and its consumer outside share (the call), else the op's
        innermost user frame."""
        made = [f for f in crossing.node.site.frames if f.library is None] if crossing.node.site else []
        library_module = crossing.node.module_path == crossing.paths[0] and crossing.node.module_type.startswith(
            "torch."
        )
        if library_module and made:
            return made[-1]
        used = (
            [f for f in crossing.consumer.site.frames if f.library is None]
            if crossing.consumer is not None and crossing.consumer.site
            else []
        )
        shared = None
        for a, b in zip(made, used, strict=False):
            if (a.file, a.line, a.function) != (b.file, b.line, b.function):
                break
            shared = a
        return shared or (made[-1] if made else None)


def _inside(module_path: str, path: str) -> bool:
    return path == "" or module_path == path or module_path.startswith(path + ".")


def _depth(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def _declares_output(layouts: PlanLayouts | None) -> bool:
    return layouts is None or bool(layouts.outputs)


def _normal(layout: str, graph: Graph, value: str) -> str:
    """`Shard(d)` with d counted from the last dim, as relations count it."""
    if not layout.startswith("Shard(") or not layout[6:-1].lstrip("-").isdigit():
        return layout
    dim = int(layout[6:-1])
    if dim >= 0:
        dim -= len(graph.meta_of(value).shape)
    return f"Shard({dim})"


def _declared(layouts: PlanLayouts | None) -> dict[str, list[str | None]]:
    if layouts is None:
        return {}
    out = {"input_claims": list(layouts.input_claims), "output_claims": list(layouts.output_claims)}
    return {k: v for k, v in {**out, "outputs": list(layouts.outputs)}.items() if v}


def _entry_note(path: str, entry: Frame, layouts: PlanLayouts | None, claim: FalseClaim | None) -> str:
    if claim is not None:
        return f"this entry declares `{path}`'s {claim.role} {claim.declared}; it is {_held_words(claim.holds)}"
    leaves = f": its output leaves as {layouts.outputs[0]}" if layouts and _one_output(layouts) else ""
    return f"the plan parallelizes `{path}` with {entry.function}{leaves}"


def _entry_advice(path: str, layouts: PlanLayouts | None, crossing: Crossing, claim: FalseClaim | None) -> str:
    where = f"in the plan entry for `{path}`"
    if claim is not None:
        return (
            f"{where}: it declares the {claim.role} {claim.declared}, but the {claim.role} is "
            f"{_held_words(claim.holds)}; declare what it is, and the plan redistributes it"
        )
    if crossing.inside or layouts is None or not _one_output(layouts):
        return f"{where}: its layouts"
    return (
        f"{where}: it hands the output on as {layouts.outputs[0]}, which the code that uses it does not expect; "
        f"give the output the layout that code needs"
    )


def _one_output(layouts: PlanLayouts) -> bool:
    return len(layouts.outputs) == 1 and layouts.outputs[0] is not None


def _held_words(holds: str) -> str:
    return {
        "Replicate()": "the full value on every rank (Replicate())",
        "Partial()": "a partial sum (Partial())",
        'Partial("max")': 'a partial max (Partial("max"))',
        "scaled": "a multiple of the reference's value",
    }.get(holds, f"a shard ({holds})")
