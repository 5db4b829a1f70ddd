"""Assume-guarantee contracts of memoized blocks: a template proven once stands for every call of
it in the skeletons, also when a rank's block receives its inputs sharded (sequence parallelism).

A template's unit is proven with each rank's block inputs *assumed* to relate to the
reference's as their shapes say (`relations.assumed`: equal, or the rank's block of the one
dimension where they differ), and must *prove* that each rank's outputs relate to the
reference's as their shapes say. That proof is a law of the rank's block as a function: for
every value X of the reference's input, block_r(X's assumed part) = the assumed part of
block_ref(X). In the skeletons:

- a template whose contract is equality everywhere is one function in every program (the
  rank's calls are the reference's opaque operation: equal inputs give equal outputs by
  congruence, the only rule an opaque call has);
- any other template's calls are, on rank r, an operation of their own, and the law is one egglog
  rule per rank and output: whenever a rank's call and the reference's call of the same block
  instance (equal literal arguments: the template and the instance path) have inputs related by
  the assumed relations (a `sel` of one range, the relation the e-graph uses for every shard, or
  the same e-class), their outputs relate by the proven ones. The rule needs the reference's call
  on those very inputs, so it only concludes about calls that exist, on values of the shapes the
  template was proven at.

A call whose inputs do not relate as assumed (a layer fed the wrong block of the sequence, fed its
input whole where the template was proven on blocks) matches no rule: its output stays unrelated,
the skeleton is not proven, and the plain run gives the verdict and the location. The check of
"every instance receives its inputs under the template's assumption" is made by the skeleton's
own saturation, call by call, on the relations it proves.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..graph.model import Graph, Node, Placeholder
from ..relations import expr as px
from ..relations.assumed import Shard, Unrelated, assumed_shard
from .language import quoted as _q
from .op_laws import FAMILY
from .opaque_calls import operand_terms
from .relations_found import RelationIndex

BLOCK_TARGET = "shardproof::block"
ASSUMED_INPUT_PREFIX = "shardproof.block-input."


@dataclass(frozen=True)
class Contract:
    """Rank `rank`'s instances of `template` against the reference's: per input, the relation
    assumed (None: equal; else the rank's block), per output the relation to prove."""

    template: str
    rank: int
    inputs: tuple[Shard | None, ...]
    outputs: tuple[Shard | None, ...]

    @property
    def congruent(self) -> bool:
        """Equal inputs and outputs: the rank's block is the reference's function."""
        return all(r is None for r in (*self.inputs, *self.outputs))


def contracts(template: str, reference: Graph, ranks: list[Graph]) -> list[Contract]:
    """Each rank's contract for a template's graphs, from their shapes; `Unrelated` (raised by
    `assumed_shard`) when some input or output fits no relation."""
    found = []
    ref_inputs = _inputs(reference)
    for graph in ranks:
        inputs = _inputs(graph)
        if [p.target for p in inputs] != [p.target for p in ref_inputs] or len(graph.outputs) != len(reference.outputs):
            raise Unrelated(f"{graph.name} passes the block other inputs or returns other outputs")
        assumed = tuple(assumed_shard(r.meta, p.meta, graph.rank) for r, p in zip(ref_inputs, inputs, strict=True))
        expected = tuple(
            assumed_shard(reference.meta_of(r), graph.meta_of(o), graph.rank)
            for r, o in zip(reference.outputs, graph.outputs, strict=True)
        )
        found.append(Contract(template, graph.rank if graph.rank is not None else -1, assumed, expected))
    return found


def _inputs(graph: Graph) -> list[Placeholder]:
    return [p for p in graph.placeholders if p.kind == "input"]


# -- the template's unit: inputs assumed -----------------------------------------------------------
def with_assumed_inputs(
    reference: Graph,
    reference_values: dict[str, px.Expr],
    ranks: list[tuple[Graph, dict[str, px.Expr]]],
    contracts_of_ranks: list[Contract],
) -> tuple[Graph, dict[str, px.Expr], list[tuple[Graph, dict[str, px.Expr]]]]:
    """The template's unit with every input some rank receives as a block made a value of its
    own in the reference (a symbol standing for any value of its shape, like an input) and the
    rank's block of it on each rank; inputs every rank receives whole stay shared inputs."""
    sharded = {
        position
        for contract in contracts_of_ranks
        for position, shard in enumerate(contract.inputs)
        if shard is not None
    }
    if not sharded:
        return reference, reference_values, ranks
    ref_inputs = _inputs(reference)
    symbols = {
        position: px.ParamRef(
            name=ASSUMED_INPUT_PREFIX + ref_inputs[position].target,
            shape=ref_inputs[position].meta.shape,
            dtype=ref_inputs[position].meta.dtype,
        )
        for position in sharded
    }

    def assumed(graph: Graph, values: dict[str, px.Expr], shards: tuple[Shard | None, ...]):
        own_values = dict(values)
        placeholders = []
        position = 0
        for p in graph.placeholders:
            if p.kind != "input":
                placeholders.append(p)
                continue
            if position in symbols:
                symbol, shard = symbols[position], shards[position]
                value: px.Expr = symbol
                if shard is not None:
                    dim, start, end = shard
                    value = px.SliceOf(
                        source=symbol, dim=dim, start=start, end=end, shape=p.meta.shape, dtype=p.meta.dtype
                    )
                placeholders.append(Placeholder(p.id, "buffer", symbol.name, p.meta))
                own_values[symbol.name] = value
            else:
                placeholders.append(p)
            position += 1
        return dataclasses.replace(graph, placeholders=placeholders), own_values

    whole = tuple(None for _ in ref_inputs)
    new_reference = assumed(reference, reference_values, whole)
    new_ranks = [assumed(g, v, c.inputs) for (g, v), c in zip(ranks, contracts_of_ranks, strict=True)]
    return new_reference[0], new_reference[1], new_ranks


def guaranteed(contract: Contract, index: RelationIndex, reference: Graph, rank: Graph) -> bool:
    """Whether the template's saturation proves every output relation the contract states."""
    for ref_value, value, expected in zip(reference.outputs, rank.outputs, contract.outputs, strict=True):
        if not holds(index, ref_value, contract.rank, value, expected):
            return False
    return True


def holds(index: RelationIndex, ref_value: str, rank: int, value: str, expected: Shard | None) -> bool:
    """Whether the saturation proves the rank's `value` is the reference's (None) or its block."""
    for relation, values in index.relations(ref_value, rank):
        if value not in values:
            continue
        if expected is None and relation.kind == "equal":
            return True
        if expected is not None and relation.kind == "sel":
            dim, start, end = expected
            if relation.dim == dim and relation.ranges == ((start, end),):
                return True
    return False


# -- the skeletons ---------------------------------------------------------------------------------
def rank_target(contract: Contract) -> str:
    """The operation a rank's calls of a non-congruent template are: one per template and rank."""
    return f"{BLOCK_TARGET} {contract.template} on rank {contract.rank}"


def template_of(node: Node) -> str | None:
    """The template of a block call (its key `template|path` is its last literal argument)."""
    if node.op != "generic" or node.attrs.get("target") != BLOCK_TARGET:
        return None
    args = node.attrs.get("args") or []
    key = args[-1] if args else None
    return key.partition("|")[0] if isinstance(key, str) else None


def with_own_calls(graph: Graph, by_template: dict[str, Contract]) -> Graph:
    """A rank's skeleton whose calls of non-congruent templates are its own operations."""
    nodes = []
    changed = False
    for node in graph.nodes:
        contract = by_template.get(template_of(node) or "")
        if contract is not None and not contract.congruent:
            node = dataclasses.replace(node, attrs={**node.attrs, "target": rank_target(contract)})
            changed = True
        nodes.append(node)
    return dataclasses.replace(graph, nodes=nodes) if changed else graph


def skeletons_and_laws(
    programs: list, units: list, unrelated: str | None = None
) -> tuple[list[tuple[Graph, dict[str, px.Expr]]], tuple[str, ...]]:
    """Each rank program's skeleton and values, with the calls of every non-congruent template an
    operation of the rank's own, and the laws of those templates; the calls of `unrelated` (a
    template not proven) are operations of their own with no law (`with_unrelated_calls`).
    `programs`: pieces with a `skeleton` and `values`; `units`: templates with their `contracts`."""
    by_rank: dict[int, dict[str, Contract]] = {}
    laws: list[str] = []
    for unit in units:
        if unit.template == unrelated:
            continue
        for contract in unit.contracts:
            by_rank.setdefault(contract.rank, {})[contract.template] = contract
            laws.extend(rules(contract))
    skeletons = []
    for program in programs:
        graph = program.skeleton if unrelated is None else with_unrelated_calls(program.skeleton, unrelated)
        skeletons.append((with_own_calls(graph, by_rank.get(program.skeleton.rank or 0, {})), program.values))
    return skeletons, tuple(laws)


def with_unrelated_calls(graph: Graph, template: str) -> Graph:
    """A rank's skeleton whose calls of `template` are an operation of the rank's own, with no
    law: nothing the template was to guarantee is assumed of them (see memoized_failure.py)."""
    if graph.rank is None:
        return graph
    target = f"{BLOCK_TARGET} {template} on rank {graph.rank}, not proven"
    nodes = [
        dataclasses.replace(node, attrs={**node.attrs, "target": target}) if template_of(node) == template else node
        for node in graph.nodes
    ]
    return dataclasses.replace(graph, nodes=nodes)


def calls_of(graph: Graph, template: str) -> list[Node]:
    """The calls of `template` in a skeleton, in program order."""
    return [node for node in graph.nodes if template_of(node) == template]


def call_key(node: Node) -> str:
    """A block call's key, `template|path` (its last literal argument)."""
    args = node.attrs.get("args") or []
    return str(args[-1]) if args else ""


def rules(contract: Contract) -> list[str]:
    """The contract's law as egglog rules, one per output (see the module docstring). The
    instance's literal arguments (template and path) are matched as `A`, the same in both calls."""
    n = len(contract.inputs)
    if contract.congruent or n < 1:
        return []
    # the calls' operands as the encoder writes them (more than four: the rest as one list)
    full = operand_terms([f"X{i}" for i in range(n)])
    own = operand_terms([f"X{i}" if shard is None else f"x{i}" for i, shard in enumerate(contract.inputs)])
    found = []
    for index, out in enumerate(contract.outputs):
        premises = [
            f"(= Y (Op{len(full)} {_q(f'{BLOCK_TARGET}#{index}')} {' '.join(full)} A))",
            f"(= y (Op{len(own)} {_q(f'{rank_target(contract)}#{index}')} {' '.join(own)} A))",
        ]
        for i, shard in enumerate(contract.inputs):
            if shard is not None:
                dim, start, end = shard
                premises.append(f"(sel X{i} x{i} {dim} (RCons {start} {end} (RNil)))")
        conclusion = "(union y Y)" if out is None else f"(union y (Slice Y {out[0]} {out[1]} {out[2]}))"
        name = json.dumps(f"block contract {contract.template} on rank {contract.rank}, output {index}")
        found.append(f"(rule ({' '.join(premises)}) ({conclusion}) :ruleset {FAMILY} :name {name})")
    return found
