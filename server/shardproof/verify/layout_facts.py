"""How the dims of a view, permute or expand correspond: the front-end facts the layout rules
follow (vkeep / vsplit / vmerge, pmap / ptail / pcompose / pinverse, emap, ebk). Shapes are static,
so these are computed here from the two shapes rather than derived in the e-graph."""

from __future__ import annotations

import math

from .language import quoted as _q


def view_facts(name: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[str]:
    """How the dims of a reshape correspond, as vkeep / vsplit / vmerge facts (negative dims).

    Non-unit dims are grouped by equal products: a group of one input and one output dim keeps a
    dim, one input and several outputs splits it (outer dim first), several inputs and one output
    merge. Size-1 dims carry no data: one may sit anywhere between the same two non-unit dims
    without changing the element order, so a unit input dim keeps onto every unit output dim of
    the same gap, and a unit dim next to a kept dim may be read as the outer part of a split
    (or merge) of it. That makes [16] -> [1, 16] on a rank line up with [192] -> [12, 16] on the
    reference.

    Every fact ends with the view's shape outside the dims it relates (those written `*`): the
    movement rules carry a selection from one pair of views to another only when these agree,
    because a selection says the two values agree in every other dim. Two views of one value
    that keep its last dim but flatten the rest differently ([2, 16, 8] to [32, 8] and to
    [2, 16, 1, 8]) are not selections of each other. Then the source's shape: a fact is stated
    of the view's class, which may also hold views of sources of other shapes (a reshape of a
    reshape); the rules apply it to a view whose source has this shape (`vshape`).
    """
    ni, no = len(in_shape), len(out_shape)
    facts: list[str] = unit_facts(name, in_shape, out_shape)
    in_real = [d for d in range(ni) if in_shape[d] != 1]
    out_real = [d for d in range(no) if out_shape[d] != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = o = 0
    while i < len(in_real) and o < len(out_real):
        gi, go = [in_real[i]], [out_real[o]]
        pi, po = in_shape[in_real[i]], out_shape[out_real[o]]
        while pi != po:
            if pi < po:
                i += 1
                if i >= len(in_real):
                    return facts
                gi.append(in_real[i])
                pi *= in_shape[in_real[i]]
            else:
                o += 1
                if o >= len(out_real):
                    return facts
                go.append(out_real[o])
                po *= out_shape[out_real[o]]
        groups.append((gi, go))
        i += 1
        o += 1

    def outside(shape: tuple[int, ...], first: int, last: int) -> str:
        return ",".join("*" if first <= d <= last else str(size) for d, size in enumerate(shape))

    source = ",".join(str(n) for n in in_shape)

    def fact(kind: str, inputs: tuple[int, int], outputs: tuple[int, int], *values: int) -> None:
        rest = f"{outside(in_shape, *inputs)}->{outside(out_shape, *outputs)}"
        facts.append(f'({kind} {name} {" ".join(str(v) for v in values)} "{rest}" "{source}")')

    for gi, go in groups:
        span = (gi[0], gi[-1]), (go[0], go[-1])
        if len(gi) == 1 and len(go) == 1:
            fact("vkeep", *span, gi[0] - ni, go[0] - no)
        elif len(gi) == 1:
            fact("vsplit", *span, gi[0] - ni, go[0] - no, math.prod(out_shape[go[0] + 1 : go[-1] + 1]))
        elif len(go) == 1:
            fact("vmerge", *span, gi[0] - ni, go[0] - no, math.prod(in_shape[gi[0] + 1 : gi[-1] + 1]))
    in_edges = [-1] + [gi[-1] for gi, _ in groups] + [ni]
    out_edges = [-1] + [go[-1] for _, go in groups] + [no]
    for k in range(len(groups) + 1):
        in_units = [d for d in range(in_edges[k] + 1, groups[k][0][0] if k < len(groups) else ni) if in_shape[d] == 1]
        out_units = [
            d for d in range(out_edges[k] + 1, groups[k][1][0] if k < len(groups) else no) if out_shape[d] == 1
        ]
        for iu in in_units:
            for ou in out_units:
                fact("vkeep", (iu, iu), (ou, ou), iu - ni, ou - no)
        if k > 0 and len(groups[k - 1][0]) == 1 and len(groups[k - 1][1]) == 1:
            # a unit dim after a kept dim may be read as its inner part, a merge with inner size 1
            # ([16, 1, 8] -> [16, 8] on a rank holding every other row of the reference's
            # [16, 2, 8] -> [32, 8])
            (i_dim,), (o_dim,) = groups[k - 1]
            for iu in in_units:
                fact("vmerge", (i_dim, iu), (o_dim, o_dim), i_dim - ni, o_dim - no, 1)
            # and a unit output dim after it, a split with inner size 1 ([2, 8] -> [2, 1, 8] on a
            # rank holding one head of the reference's [8, 8] -> [2, 4, 8])
            for ou in out_units:
                fact("vsplit", (i_dim, i_dim), (o_dim, ou), i_dim - ni, o_dim - no, 1)
        if k < len(groups) and len(groups[k][1]) == 1 < len(groups[k][0]):
            # a unit dim before a merge may be read as its outermost part ([1, 8, 32] -> [256] on
            # a rank holding one row of the reference's [4, 8, 32] -> [1024])
            gi, (o_dim,) = groups[k]
            for iu in in_units:
                fact(
                    "vmerge",
                    (iu, gi[-1]),
                    (o_dim, o_dim),
                    iu - ni,
                    o_dim - no,
                    math.prod(in_shape[iu + 1 : gi[-1] + 1]),
                )
        if k < len(groups) and len(groups[k][0]) == 1 < len(groups[k][1]):
            (i_dim,), go = groups[k]
            for ou in out_units:
                fact(
                    "vsplit",
                    (i_dim, i_dim),
                    (ou, go[-1]),
                    i_dim - ni,
                    ou - no,
                    math.prod(out_shape[ou + 1 : go[-1] + 1]),
                )
        if k < len(groups) and len(groups[k][0]) == 1 and len(groups[k][1]) == 1:
            (i_dim,), (o_dim,) = groups[k]
            for ou in out_units:
                fact(
                    "vsplit", (i_dim, i_dim), (ou, o_dim), i_dim - ni, ou - no, math.prod(out_shape[ou + 1 : o_dim + 1])
                )
            for iu in in_units:
                fact(
                    "vmerge", (iu, i_dim), (o_dim, o_dim), iu - ni, o_dim - no, math.prod(in_shape[iu + 1 : i_dim + 1])
                )
    return facts


def unit_facts(name: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[str]:
    """(vunit y d s): view y only inserts a size-1 dim d into its source's shape s (an unsqueeze,
    as `stack` writes each of its pieces), so reducing y over d gives back a source of that shape;
    (vsqueeze y d): view y only removes the size-1 dim d of its source (both d negative, in the
    longer shape)."""
    facts = []
    source = ",".join(str(n) for n in in_shape)
    for o in range(len(out_shape)):
        if out_shape[o] == 1 and tuple(out_shape[:o]) + tuple(out_shape[o + 1 :]) == tuple(in_shape):
            facts.append(f'(vunit {name} {o - len(out_shape)} "{source}")')
    for i in range(len(in_shape)):
        if in_shape[i] == 1 and tuple(in_shape[:i]) + tuple(in_shape[i + 1 :]) == tuple(out_shape):
            facts.append(f"(vsqueeze {name} {i - len(in_shape)})")
    return facts


def broadcast_facts(name: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[str]:
    """(ebk y d key): dim d of expansion y is broadcast (absent or of size 1 in the source); key is
    y's shape with dim d left out, so two expansions of one value with equal keys differ only along d.
    (ebsrc y d): y broadcasts only dim d, from size 1."""
    facts = []
    for k in range(1, len(out_shape) + 1):
        if k > len(in_shape) or in_shape[-k] == 1:
            key = ",".join("_" if i == len(out_shape) - k else str(s) for i, s in enumerate(out_shape))
            facts.append(f"(ebk {name} {-k} {_q(key)})")
    # (ebsrc y d): the source is y with dim d cut to size 1 (the only dim the expansion broadcasts)
    broadcast = (
        [d for d in range(len(out_shape)) if in_shape[d] != out_shape[d]] if len(in_shape) == len(out_shape) else []
    )
    if len(broadcast) == 1 and in_shape[broadcast[0]] == 1:
        facts.append(f"(ebsrc {name} {broadcast[0] - len(out_shape)})")
    return facts


def permute_facts(perm: list[int]) -> list[str]:
    """Output dim o of the permutation `perm` is input dim perm[o] (negative dims), and (ptail p k):
    it leaves its last k dims in place (k the most it does): facts about the permutation itself (its
    text, as terms write it), true of every term that applies it, so two permutations of different
    sources may be one value without mixing their dim maps."""
    nd = len(perm)
    text = _permutation_text(perm)
    kept = 0
    while kept < nd and perm[nd - 1 - kept] == nd - 1 - kept:
        kept += 1
    facts = [f"(pmap {text} {in_dim - nd} {out_dim - nd})" for out_dim, in_dim in enumerate(perm)]
    return [*facts, f"(ptail {text} {kept})"]


def composition_facts(first: list[int], then: list[int]) -> list[str]:
    """How x.permute(first).permute(then) permutes x: (pinverse first then) when it is x itself,
    else (pcompose first then composed) with the composed permutation's own facts. Output dim o of
    the second permutation is its input dim then[o], which is x's dim first[then[o]]."""
    if len(first) != len(then):
        return []
    composed = [first[i] for i in then]
    if composed == sorted(composed):
        return [f"(pinverse {_permutation_text(first)} {_permutation_text(then)})"]
    return [
        f"(pcompose {_permutation_text(first)} {_permutation_text(then)} {_permutation_text(composed)})",
        *permute_facts(composed),
    ]


def _permutation_text(perm: list[int]) -> str:
    """A permutation as terms write it: `(Permute x "0,2,1")`."""
    return _q(",".join(str(p) for p in perm))


def expand_facts(name: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[str]:
    """(emap y d key): dim d of expansion y is its source's dim d (not broadcast); key is y's shape
    with dim d left out, so a selection along d carries over between two expansions only when
    they expand every other dim alike (a rank's 4 heads and the reference's 8 are no selection
    along another dim of each other)."""
    facts = []
    for k in range(1, len(in_shape) + 1):
        if in_shape[-k] == out_shape[-k]:
            key = ",".join("_" if i == len(out_shape) - k else str(s) for i, s in enumerate(out_shape))
            facts.append(f"(emap {name} {-k} {_q(key)})")
    return facts
