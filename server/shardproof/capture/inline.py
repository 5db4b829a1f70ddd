"""Put a lone module's graph back into the skeleton that called it (see blocks.lone_modules).

The skeleton is traced with each lone module one opaque call (`shardproof::block`), and the module
on its own inside the wrapper templates are traced in (`block.` before its own names), with the
inputs the call passed. Inlining replaces the call's results by the module's outputs, its inputs
by the call's arguments and its parameters by the program's own (the module's names under its
path), and puts the call's frames before the module's, so that the skeleton reads as the program
traced whole: the same operations on the same values, with the same source lines.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph.model import Graph, Node, Placeholder, SourceSite
from ..verify.block_contracts import BLOCK_TARGET, call_key

_WRAPPER = "block"  # the attribute of the wrapper that templates and lone modules are traced in
_PREFIXES = {"parameter": "p_", "buffer": "b_", "constant": "c_"}


class NotInlined(Exception):
    """The module's graph does not line up with its call (the skeleton is then traced whole)."""


def inline_calls(skeleton: Graph, graphs: dict[str, Graph]) -> Graph:
    """`skeleton` with each call whose key (`template|path`) is in `graphs` replaced by that graph."""
    used = {p.id for p in skeleton.placeholders} | {n.id for n in skeleton.nodes}
    targets = {(p.kind, p.target): p.id for p in skeleton.placeholders}
    added: list[Placeholder] = []
    renamed: dict[str, str] = {}  # a call's result -> the module's output, as named in the skeleton
    results: dict[str, list[str]] = {}  # a call's key -> its module's outputs, as named in the skeleton
    metas = {p.id: p.meta for p in skeleton.placeholders} | {n.id: n.meta for n in skeleton.nodes}
    nodes: list[Node] = []
    merged = replace(skeleton, placeholders=[], nodes=nodes, outputs=[])
    merged.source_files = set(skeleton.source_files)
    merged.constants, merged.view_twins = dict(skeleton.constants), dict(skeleton.view_twins)
    for node in skeleton.nodes:
        key = call_key(node) if node.attrs.get("target") == BLOCK_TARGET else ""
        if key not in graphs:
            nodes.append(replace(node, inputs=tuple(renamed.get(i, i) for i in node.inputs)))
            continue
        graph = graphs[key]
        if key not in results:
            path = key.partition("|")[2]
            names = _names(graph, node, path, used, targets, added, renamed)
            for placeholder in graph.placeholders:
                if placeholder.kind == "input" and metas.get(names[placeholder.id]) != placeholder.meta:
                    raise NotInlined(f"{key}: input {placeholder.target} has another shape")
            moved = _moved(graph, names, node.site, path)
            nodes.extend(moved)
            metas.update({n.id: n.meta for n in moved})
            _merge_tables(merged, graph, names, node.site)
            results[key] = [names[o] for o in graph.outputs]
        outputs = results[key]
        index = node.attrs.get("index", 0)
        if not isinstance(index, int) or not 0 <= index < len(outputs):
            raise NotInlined(f"{key}: result {index} of {len(outputs)}")
        if graph.meta_of(graph.outputs[index]) != node.meta:
            raise NotInlined(f"{key}: result {index} has another shape")
        renamed[node.id] = outputs[index]
    held = [p for p in skeleton.placeholders if p.kind != "input"]  # parameters, buffers, constants first
    merged.placeholders = [*held, *added, *(p for p in skeleton.placeholders if p.kind == "input")]
    merged.outputs = [renamed.get(o, o) for o in skeleton.outputs]
    return merged


def _names(
    graph: Graph,
    call: Node,
    path: str,
    used: set[str],
    targets: dict[tuple[str, str], str],
    added: list[Placeholder],
    renamed: dict[str, str],
) -> dict[str, str]:
    """Each value of `graph` -> its name in the skeleton: inputs are the call's arguments, tensors
    the module holds are the program's placeholders under its path, operations get fresh names."""
    if graph.gradient_roles or any(n.collective is not None and n.collective.kind == "p2p" for n in graph.nodes):
        raise NotInlined(f"{path}: gradients or point-to-point calls")
    names: dict[str, str] = {}
    arguments = [renamed.get(i, i) for i in call.inputs]
    for placeholder in graph.placeholders:
        if placeholder.kind == "input":
            position = int(placeholder.target)
            if position >= len(arguments):
                raise NotInlined(f"{path}: input {position} of {len(arguments)}")
            names[placeholder.id] = arguments[position]
            continue
        target = _under(placeholder.target, path)
        if target is None:
            target = placeholder.target
            if (placeholder.kind, target) in targets:  # a lifted constant's name, taken in the skeleton
                target = f"{path}.{target}"
        known = targets.get((placeholder.kind, target))
        if known is None:
            known = _fresh(_PREFIXES.get(placeholder.kind, "") + target.replace(".", "_"), used)
            targets[(placeholder.kind, target)] = known
            added.append(replace(placeholder, id=known, target=target))
        names[placeholder.id] = known
    for node in graph.nodes:
        names[node.id] = _fresh(node.id, used, path.replace(".", "_") + "_")
    return names


def _under(name: str, path: str) -> str | None:
    """A name inside the wrapper (`block`, `block.weight`) as the program names it under `path`;
    None for a name outside it."""
    if name == _WRAPPER or name.startswith(_WRAPPER + "."):
        return path + name[len(_WRAPPER) :]
    return None


def _fresh(name: str, used: set[str], prefix: str = "") -> str:
    """`name`, or `prefix` + name (numbered if need be) when the skeleton already uses it."""
    candidate, number = name, 0
    while candidate in used:
        number += 1
        candidate = f"{prefix}{name}" if number == 1 else f"{prefix}{name}_{number}"
    used.add(candidate)
    return candidate


def _moved(graph: Graph, names: dict[str, str], site: SourceSite | None, path: str) -> list[Node]:
    """The module's operations named as in the skeleton, under its path, called from the call's site."""
    moved = []
    for node in graph.nodes:
        moved.append(
            replace(
                node,
                id=names[node.id],
                inputs=tuple(names[i] for i in node.inputs),
                module_path=_under(node.module_path, path) or node.module_path or path,
                site=_called_from(site, node.site),
            )
        )
    return moved


def _called_from(call: SourceSite | None, inner: SourceSite | None) -> SourceSite | None:
    if call is None:
        return inner
    if inner is None:
        return call
    return SourceSite(call.frames + inner.frames)


def _merge_tables(merged: Graph, graph: Graph, names: dict[str, str], site: SourceSite | None) -> None:
    """What the module's graph says of its values, said of their names in the skeleton."""
    merged.source_files |= graph.source_files
    merged.constants.update({names.get(k, k): v for k, v in graph.constants.items()})
    merged.view_twins.update({names.get(k, k): names.get(v, v) for k, v in graph.view_twins.items()})
    merged.identity_dropouts = [*merged.identity_dropouts, *(_called_from(site, s) for s in graph.identity_dropouts)]
    merged.gradient_cuts = [*merged.gradient_cuts, *(_called_from(site, s) for s in graph.gradient_cuts)]
