"""What the localizer reads: the graphs, the values the ranks' parameters were given, the relations
saturation proved, and the collective issues the encoder found."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ..graph.model import Graph
from ..graph.numbers import BuilderNumbers
from ..relations import expr as px
from ..verify.encode import CollectiveIssue
from ..verify.relations_found import RelationIndex


@dataclass
class Evidence:
    reference: Graph
    ranks: list[Graph]
    rank_values: list[dict[str, px.Expr]]
    index: RelationIndex
    issues: list[CollectiveIssue]
    outputs_of: list[int] | None = None  # the ranks whose outputs are compared (None: every rank)
    # constant factors the encoder carried outside values of joint graphs: (graph, value) -> factor
    factors: dict[tuple[str, str], Fraction] = field(default_factory=dict)
    # opaque calls that rules follow (derived laws, rules matching the call whole): an input
    # relation no rule accepts there is a finding, not an unsupported operation
    law_targets: frozenset[str] = frozenset()
    # per rank, the torch calls of the parallel builder that received numbers computed from the
    # rank or the world size (capture/numbers.py): where shard offsets and sizes came from
    rank_numbers: list[BuilderNumbers] = field(default_factory=list)
