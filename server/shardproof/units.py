"""Units of verification (a reference and its ranks, whole or a part), saturated at once in the
sandbox (the cache answers those it holds), and what a verdict says of them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from .verify.cache import saturate_all as saturate_all_cached
from .verify.encode import encode_unit
from .verify.relations_found import RelationIndex
from .verify.sandbox import Job, Sandbox
from .verify.verdict import output_relations

if TYPE_CHECKING:
    from .config import Check
    from .graph.model import Graph
    from .relations.expr import Expr
    from .results import OutputRelation
    from .verify.encode import EncodedUnit
    from .verify.engine import Saturation


@dataclass
class UnitProof:
    """One saturated unit (the reference and the ranks of a template, skeleton or part)."""

    reference: Graph
    ranks: list[Graph]
    encoded: EncodedUnit
    saturation: Saturation
    cached: bool

    @cached_property
    def index(self) -> RelationIndex | None:
        """The proven relations, when the saturation ended with facts and the ranks' collectives
        matched."""
        if self.saturation.facts is None or self.encoded.issues:
            return None
        return RelationIndex(self.reference, self.ranks, self.saturation.facts)

    def outputs(self, policy: str) -> list[OutputRelation] | None:
        """The unit's output relations when every output meets `policy`, else None."""
        index = self.index
        if index is None:
            return None
        outputs, failing = output_relations(index, self.reference, self.ranks, policy)
        return None if failing else outputs


@dataclass
class Unit:
    """What `prove_units` saturates: the reference, its values, every rank with its values, and
    the laws of opaque calls proven elsewhere (see `encode_unit`)."""

    reference: Graph
    reference_values: dict[str, Expr]
    ranks: list[tuple[Graph, dict[str, Expr]]]
    call_laws: tuple[str, ...] = ()
    outputs_only: bool | None = None  # None: as `prove_units` is told


def prove_units(
    sandbox: Sandbox,
    check: Check,
    units: list[Unit] | list[tuple[Graph, dict[str, Expr], list[tuple[Graph, dict[str, Expr]]]]],
    outputs_only: bool = False,
) -> list[UnitProof]:
    """Saturate independent units at once (the cache answers those it holds). With
    `outputs_only`, only the units' outputs are read from their proofs (see `encode_unit`)."""
    bounds = check.bounds
    given = [unit if isinstance(unit, Unit) else Unit(*unit) for unit in units]
    only = [outputs_only if u.outputs_only is None else u.outputs_only for u in given]
    encoded = [
        encode_unit(u.reference, u.reference_values, u.ranks, reads_outputs, u.call_laws)
        for u, reads_outputs in zip(given, only, strict=True)
    ]
    jobs = [Job(e.commands, bounds.iterations, bounds.seconds, bounds.max_rows) for e in encoded]
    saturated = saturate_all_cached(sandbox, jobs)
    return [
        UnitProof(u.reference, [graph for graph, _ in u.ranks], unit, saturation, cached)
        for u, unit, (saturation, cached) in zip(given, encoded, saturated, strict=True)
    ]


def unit_stats(proofs: list[UnitProof]) -> dict[str, object]:
    statuses = [proof.saturation.status for proof in proofs]
    return {
        "terms": sum(proof.encoded.n_terms for proof in proofs),
        "egraph_rows": max(proof.saturation.rows for proof in proofs),
        # the saturations' own time, added up over units (they overlap when run at once)
        "saturation_seconds": round(sum(p.saturation.seconds for p in proofs if not p.cached), 4),
        "saturation_status": next((status for status in statuses if status != "fixpoint"), "fixpoint"),
        "units": len(proofs),
        "cached_units": sum(proof.cached for proof in proofs),
    }


def outputs_summary(outputs: list[OutputRelation]) -> str:
    return "; ".join(f"output {o.index}: {o.description}" for o in outputs)


def dropout_notes(graphs: list[Graph]) -> list[str]:
    """What a verdict takes as given about these programs: each dropout in training mode taken as
    the identity (its random mask is no function of the inputs), once per line."""
    places = [(f.file, f.line) for g in graphs for s in g.identity_dropouts if (f := s.innermost) is not None]
    return [
        f"dropout in training mode at {os.path.basename(file)}:{line} taken as the identity "
        "(the forward is verified as in eval mode; a random mask is no function of the inputs)"
        for file, line in dict.fromkeys(places)
    ]
