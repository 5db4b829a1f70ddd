"""wrong-shard of a sum split over ranks by its terms (expert parallelism without all-to-all: each
rank adds up its own experts' outputs, one all-reduce adds the ranks' sums): the terms the ranks
add do not make up the reference's sum exactly once (an expert summed on two ranks, or on none).

The terms are read as verify/sum_forms.py reads them (chains of same-shape additions, zeros
dropped); a rank's term is the reference's term it is proven equal to. When every rank's terms
are a run of consecutive reference terms, the runs are what the ranks' cuts of their experts
hold, and the report goes where that cut's numbers were computed (number_origin.py)."""

from __future__ import annotations

from ...graph.model import Graph, Node
from ...results import Discrepancy
from ...verify.sum_forms import SumForms
from ..context import Context
from ..number_origin import cut_lines, moved_to, number_origin
from ..sites import line_of, to_site
from .reduction_coverage import tiling_problem


def term_coverage(ctx: Context, failing_outputs: list[int]) -> Discrepancy | None:
    del failing_outputs
    reference_sums = _sums(ctx.reference)
    chains = {term: chain for chain, terms in reference_sums.maximal_chains().items() for term in terms}
    by_site: dict[tuple[object, ...], dict[int, Node]] = {}
    for rank, graph in enumerate(ctx.ev.ranks):
        seen: dict[object, int] = {}
        for node in graph.nodes:
            coll = node.collective
            if node.op != "all_reduce" or coll is None or (coll.reduce_op or "sum") != "sum" or len(coll.group) < 2:
                continue
            site = node.site.innermost if node.site else None
            where = (site.file, site.line, site.column) if site else None
            seen[where] = seen.get(where, 0) + 1
            by_site.setdefault((where, seen[where]), {})[rank] = node
    for reductions in by_site.values():
        found = _coverage(ctx, reductions, reference_sums, chains)
        if found is not None:
            return found
    return None


def _sums(graph: Graph) -> SumForms:
    forms = SumForms()
    metas = {p.id: p.meta for p in graph.placeholders}
    for node in graph.nodes:
        metas[node.id] = node.meta
        if node.op == "constant" and node.attrs.get("zero"):
            forms.add_zero(node.id)
        elif node.op == "binary" and node.attrs.get("fn") == "add" and all(i in metas for i in node.inputs):
            forms.note_addition(node.id, list(node.inputs), [metas[i] for i in node.inputs], node.meta)
    return forms


def _coverage(
    ctx: Context,
    reductions: dict[int, Node],
    reference_sums: SumForms,
    chains: dict[str, str],
) -> Discrepancy | None:
    if len(reductions) < 2:
        return None
    held: dict[int, list[int]] = {}
    chain: str | None = None
    for rank, node in reductions.items():
        terms = _sums_of_rank(ctx, rank).terms_of(node.inputs[0])
        positions = []
        for term in terms:
            matched = _reference_term(ctx, rank, term, chains)
            if matched is None:
                return None  # a term that is no term of a reference sum: not this kind of mistake
            ref_chain, position = matched
            if chain is None:
                chain = ref_chain
            elif ref_chain != chain:
                return None
            positions.append(position)
        held[rank] = sorted(positions)
    if chain is None or len({tuple(p) for p in held.values()}) == 1:
        # every rank adds the same terms: a value held alike everywhere, reduced (the duplicate
        # reduction's detector says that), not a sum split over the ranks by its terms
        return None
    total = len(reference_sums.terms[chain])
    counts = [sum(p.count(i) for p in held.values()) for i in range(total)]
    if all(c == 1 for c in counts):
        return None
    twice = [i for i, c in enumerate(counts) if c > 1]
    never = [i for i, c in enumerate(counts) if c == 0]
    problems = []
    if twice:
        owners = sorted(r for r, p in held.items() if set(p) & set(twice))
        problems.append(f"{_terms(twice)} {'is' if len(twice) == 1 else 'are'} added on ranks {_listed(owners)}")
    if never:
        problems.append(f"{_terms(never)} on no rank")
    held_text = ", ".join(f"rank {r}: {_listed(p) or 'none'}" for r, p in sorted(held.items()))
    reduction = next(iter(reductions.values()))
    ref_node = ctx.ref_nodes.get(chain)
    where = ctx.rank_site(reduction)
    found = Discrepancy(
        kind="wrong-shard",
        message=f"the all-reduce at {where.short() if where else '?'} adds up the ranks' sums of terms of the "
        f"reference's sum of {total} terms, but {' and '.join(problems)} ({held_text})",
        primary=where,
        reference=ctx.ref_site(ref_node, "the reference adds every term once") if ref_node else None,
        ranks=sorted(held),
        reference_node=chain,
        parallel_nodes=[f"{ctx.ev.ranks[r].name}/{n.id}" for r, n in reductions.items()],
        expected=f"each of the {total} terms added on exactly one rank",
        found="; ".join(problems) + f" ({held_text})",
        suggestion="give every rank its own terms (its own experts), each term on exactly one rank",
    )
    # every rank adds a run of consecutive terms: the runs are what the ranks' cuts (of their
    # experts) hold, and the report goes to the cut, or where its numbers were computed
    runs = {r: (p[0], p[-1] + 1) for r, p in held.items() if p and p == list(range(p[0], p[-1] + 1))}
    if len(runs) == len(held) and tiling_problem(runs, total) is not None:
        for line in cut_lines(ctx.ev.rank_numbers, runs, total):
            origin = number_origin(ctx.ev.rank_numbers, line, runs)
            if origin is not None:
                return moved_to(found, origin)
            cut = next(u.frame for n in ctx.ev.rank_numbers for u in n.uses if u.frame and line_of(u.frame) == line)
            reduction_site, found.primary = found.primary, to_site(cut, "the ranks' terms are cut here")
            found.related.extend([reduction_site] if reduction_site is not None else [])
            return found
    return found


def _sums_of_rank(ctx: Context, rank: int) -> SumForms:
    cache = ctx.__dict__.setdefault("_term_sums", {})
    if rank not in cache:
        cache[rank] = _sums(ctx.ev.ranks[rank])
    return cache[rank]


def _reference_term(ctx: Context, rank: int, term: str, chains: dict[str, str]) -> tuple[str, int] | None:
    """The reference sum and the position in it of the term a rank's term is proven equal to."""
    c = ctx.index.class_of(ctx.ev.ranks[rank].name, term)
    if c is None:
        return None
    for ref_value in ctx.index.reference_values(c):
        chain = chains.get(ref_value)
        if chain is not None:
            return chain, _position(ctx, chain, ref_value)
    return None


def _position(ctx: Context, chain: str, term: str) -> int:
    cache = ctx.__dict__.setdefault("_term_positions", {})
    if chain not in cache:
        cache[chain] = _sums(ctx.reference).terms[chain]
    return cache[chain].index(term)


def _terms(positions: list[int]) -> str:
    return f"term{'s' if len(set(positions)) > 1 else ''} {_listed(positions)}"


def _listed(values: list[int]) -> str:
    return ", ".join(str(v) for v in sorted(set(values)))
