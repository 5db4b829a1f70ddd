"""Opaque calls (operations the normalizer keeps whole): their terms' names and arguments, and
the chains of them a unit that reads only its outputs may collapse."""

from __future__ import annotations

import json

from ..graph.model import Graph, Node
from .language import quoted as _q


def opaque_key(node: Node) -> str:
    """The quoted name of an opaque call's function symbol: its target and output index."""
    return _q(f"{node.attrs.get('target', node.op)}#{node.attrs.get('index', 0)}")


def opaque_attrs(node: Node) -> str:
    """The quoted literal arguments of an opaque call (part of its term)."""
    return _q(json.dumps(_opaque_payload(node), sort_keys=True, default=str))


# The function symbol that holds an opaque call's operands after its third, as a list: terms have at
# most four operands (`OpN`, language.py). No rule names it, so it means only what congruence says:
# equal operands, equal lists.
OPERAND_LIST = _q("shardproof::operands")
MOST_OPERANDS = 4


def operand_terms(operands: list[str]) -> list[str]:
    """An opaque call's operands as at most `MOST_OPERANDS` terms: the first three, then the rest
    as one list (a chain of `OPERAND_LIST` pairs). The same call on the same operands gives the
    same terms, so congruence relates calls of any number of operands, as it does those of four."""
    if len(operands) <= MOST_OPERANDS:
        return list(operands)
    listed = operands[-1]
    for operand in reversed(operands[MOST_OPERANDS - 1 : -1]):
        listed = f'(Op2 {OPERAND_LIST} {operand} {listed} "")'
    return [*operands[: MOST_OPERANDS - 1], listed]


def _opaque_payload(node: Node) -> object:
    """What decides an opaque call's result besides its target and inputs: its literal arguments
    and the names of its keyword arguments (whose values are among the arguments)."""
    args = node.attrs.get("args", [])
    kwargs = node.attrs.get("kwargs", [])
    return {"args": args, "kwargs": kwargs} if kwargs else args


def collapse_opaque_chains(graph: Graph) -> Graph:
    """`graph` with every chain of opaque calls made one opaque call (for a unit whose verdict
    reads only its outputs).

    A chain: calls of one target, each reading the one before it at the same argument position
    and nothing else new (the other arguments are the same values), and each call's value read
    only by the next and not an output. A memoized skeleton is one: a block call per layer, each
    reading the previous layer's output and the same rotary tables. The chain becomes one call of
    "chain of <target>" on the first call's arguments, with every call's literal arguments (the
    instance paths) and the position in its key. Sound: two programs with the same chain term
    compose the same calls in the same order, so on equal inputs they give equal outputs, the
    only thing congruence (the sole rule of opaque calls) would have proven link by link; and
    no unit with this encoding reads the values inside a chain."""
    readers, nodes = graph.consumers(), graph.node_map()
    outputs = set(graph.outputs)

    def link(node: Node) -> tuple[Node, int] | None:
        """The next call of node's chain and where it reads node, if any."""
        following = readers.get(node.id, [])
        if node.op != "generic" or node.id in outputs or len(following) != 1:
            return None
        after = nodes[following[0]]
        same_call = (after.op, after.attrs.get("target"), after.attrs.get("index")) == (
            node.op,
            node.attrs.get("target"),
            node.attrs.get("index"),
        )
        if not same_call or after.inputs.count(node.id) != 1 or len(after.inputs) != len(node.inputs):
            return None
        position = after.inputs.index(node.id)
        others = after.inputs[:position] + after.inputs[position + 1 :]
        if others != node.inputs[:position] + node.inputs[position + 1 :]:
            return None
        return after, position

    links = {node.id: found for node in graph.nodes if (found := link(node)) is not None}
    continued = {after.id for after, _ in links.values()}
    replaced: dict[str, Node] = {}  # the last call of each chain -> the chain's call
    inside: set[str] = set()
    for node in graph.nodes:
        if node.id not in links or node.id in continued:
            continue
        chain, position = [node], links[node.id][1]
        while chain[-1].id in links and links[chain[-1].id][1] == position:
            chain.append(links[chain[-1].id][0])
        if len(chain) < 2:
            continue
        last = chain[-1]
        inside.update(call.id for call in chain[:-1])
        attrs = {
            "target": f"chain of {last.attrs.get('target')}",
            "index": last.attrs.get("index", 0),
            "args": {"position": position, "calls": [_opaque_payload(call) for call in chain]},
        }
        replaced[last.id] = Node(
            last.id, "generic", node.inputs, attrs, last.meta, last.site, last.module_path, last.module_type
        )
    if not replaced:
        return graph
    nodes = [replaced.get(node.id, node) for node in graph.nodes if node.id not in inside]
    return Graph(
        graph.name,
        graph.rank,
        graph.world_size,
        graph.placeholders,
        nodes,
        graph.outputs,
        graph.source_files,
        graph.plan_entries,
        view_twins=graph.view_twins,
    )


def _between_opaque_calls(graph: Graph, with_laws: frozenset[str] = frozenset()) -> set[str]:
    """Values of opaque calls (`generic` nodes) read only by opaque calls without derived laws
    (whose rules read their inputs' shapes), outputs excepted."""
    readers, nodes = graph.consumers(), graph.node_map()
    outputs = set(graph.outputs)

    def lawless(reader: Node) -> bool:
        return reader.op == "generic" and str(reader.attrs.get("target")) not in with_laws

    return {
        node.id
        for node in graph.nodes
        if node.op == "generic"
        and node.id not in outputs
        and node.id in readers
        and all(lawless(nodes[reader]) for reader in readers[node.id])
    }
