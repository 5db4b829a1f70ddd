"""Ranks whose blocking point-to-point calls wait for each other: a hang no matching of calls shows.

A blocking call (`send`, `recv`) returns once its peer has posted the matching call (the same
direction's next value between the two ranks); a non-blocking one (`isend`, `irecv`, a batch)
posts and goes on. Every rank's calls are played out together, each in its own order (two ranks
that both `send` first hang on gloo, whatever the size; so does a ring in which every rank sends
to the next before receiving from the previous). When no rank can go on, the ranks left waiting
on each other in a cycle hang; a rank waiting for a call its peer never makes is an unpaired call,
which the matching of calls reports (collective_encoding.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.model import Graph, Node

Key = tuple[tuple[int, ...], int, int]  # (the pair of ranks, the sending rank, its count of values sent before)


@dataclass
class Hang:
    ranks: tuple[int, ...]  # the cycle, sorted
    position: int  # where the lowest rank of the cycle waits, among its point-to-point calls
    message: str
    nodes: list[tuple[str, str]]  # (graph name, node id) of each waiting call, in the cycle's order


def blocking_hangs(graphs: list[Graph]) -> list[Hang]:
    calls = {g.rank: [n for n in g.nodes if n.collective is not None and n.collective.kind == "p2p"] for g in graphs}
    if not any(n.attrs.get("blocking") for nodes in calls.values() for n in nodes):
        return []
    keys = {rank: _keys(nodes) for rank, nodes in calls.items()}
    waiting = _played_out(calls, keys)
    waits_for = {rank: _peer(calls[rank][at], rank) for rank, at in waiting.items()}  # type: ignore[index]
    names = {g.rank: g.name for g in graphs}
    hangs: list[Hang] = []
    seen: set[frozenset[int]] = set()
    for start in sorted(waits_for):  # type: ignore[type-var]
        path: list[int] = []
        rank = start
        while rank in waits_for and rank not in path:
            path.append(rank)
            rank = waits_for[rank]
        if rank not in path:
            continue  # the chain ends at a rank that finished: a call never made (an unpaired call)
        cycle = path[path.index(rank) :]
        if frozenset(cycle) in seen:
            continue
        seen.add(frozenset(cycle))
        if not all(keys[r][waiting[r]] in keys[waits_for[r]] for r in cycle):
            continue  # a call the peer never makes: the matching reports it
        lowest = cycle.index(min(cycle))
        cycle = cycle[lowest:] + cycle[:lowest]
        stuck = [calls[r][waiting[r]] for r in cycle]
        hangs.append(
            Hang(
                tuple(sorted(cycle)),
                waiting[cycle[0]],
                _message(cycle, stuck),
                [(names[r], node.id) for r, node in zip(cycle, stuck, strict=True)],
            )
        )
    return hangs


def _peer(node: Node, rank: int) -> int:
    assert node.collective is not None
    others = [r for r in node.collective.group if r != rank]
    return others[0] if others else rank


def _keys(nodes: list[Node]) -> list[Key]:
    """Each call's (pair, sending rank, how many values that rank sent before in the pair)."""
    seen: dict[tuple[tuple[int, ...], int], int] = {}
    keys = []
    for node in nodes:
        assert node.collective is not None and node.collective.src is not None
        channel = (tuple(node.collective.group), node.collective.src)
        keys.append((*channel, seen.get(channel, 0)))
        seen[channel] = seen.get(channel, 0) + 1
    return keys


def _played_out(calls: dict[int | None, list[Node]], keys: dict[int | None, list[Key]]) -> dict[int, int]:
    """Where each rank that cannot go on waits (empty: every rank finishes)."""
    position = dict.fromkeys(calls, 0)
    posted: dict[int | None, set[Key]] = {rank: set() for rank in calls}
    moved = True
    while moved:
        moved = False
        for rank, nodes in calls.items():
            while position[rank] < len(nodes):
                node, key = nodes[position[rank]], keys[rank][position[rank]]
                posted[rank].add(key)
                peer = _peer(node, rank)  # type: ignore[arg-type]
                if node.attrs.get("blocking") and key not in posted.get(peer, set()):
                    break
                position[rank] += 1
                moved = True
    return {rank: at for rank, at in position.items() if at < len(calls[rank])}  # type: ignore[misc]


def _verb(node: Node) -> str:
    return "send" if node.attrs.get("send") else "receive"


def _message(cycle: list[int], stuck: list[Node]) -> str:
    if len(cycle) == 2:
        (a, b), (first, second) = cycle, stuck
        if _verb(first) == _verb(second):
            return (
                f"ranks [{a}, {b}] both {_verb(first)} to each other first with blocking calls, each waiting for the "
                "other's matching call (a hang)"
            )
        return (
            f"rank {a} blocks in a {_verb(first)} and rank {b} in a {_verb(second)}, each before the call the other "
            "waits for (a hang)"
        )
    steps = ", ".join(
        f"rank {r} in a {_verb(node)} {'to' if _verb(node) == 'send' else 'from'} rank {_peer(node, r)}"
        for r, node in zip(cycle, stuck, strict=True)
    )
    return (
        f"ranks {sorted(cycle)} block in a cycle of blocking calls ({steps}), each waiting for a call the next "
        "makes only after its own (a hang)"
    )
