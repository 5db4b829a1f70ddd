"""The layouts a plan entry declares for its module's activations (graph.model.PlanLayouts).

Read from the style object the entry applied, torch's (`ColwiseParallel`, `RowwiseParallel`,
`SequenceParallel`, `PrepareModuleInput`, `PrepareModuleOutput`) or transformers' (the objects its
style names resolve to, with the same attribute names). What the attributes mean is DTensor's:

- `input_layouts` is what the entry *claims* the inputs are: a plain tensor is wrapped with
  `DTensor.from_local(x, input_layouts)`, taken on trust, then redistributed to the layout the
  module computes with;
- `output_layouts` next to `desired_output_layouts` (PrepareModuleOutput) is likewise a claim
  about what the forward returns, and `desired_output_layouts` what the output leaves with;
- `output_layouts` alone (ColwiseParallel, RowwiseParallel) is what the output leaves with: the
  module computes its own output's layout (DTensor's sharding propagation), so there is no claim;
- SequenceParallel's `sequence_sharding` is both the inputs' claim and the outputs' layout.
"""

from __future__ import annotations

from ..graph.model import PlanLayouts


def layouts_of(style: object) -> PlanLayouts | None:
    """The layouts `style` declares, or None when it declares none this reads."""
    sequence = getattr(style, "sequence_sharding", None)
    if sequence is not None:
        names = _names(sequence)
        return PlanLayouts(input_claims=names, outputs=names)
    inputs = _names(getattr(style, "input_layouts", None))
    outputs = _names(getattr(style, "output_layouts", None))
    if hasattr(style, "desired_output_layouts"):
        found = PlanLayouts(inputs, outputs, _names(style.desired_output_layouts))
    else:
        found = PlanLayouts(input_claims=inputs, outputs=outputs)
    return found if found != PlanLayouts() else None


def merged(first: PlanLayouts | None, second: PlanLayouts | None) -> PlanLayouts | None:
    """Two styles applied to one module (PrepareModuleInputOutput applies its input and its output
    halves): each field from the style that declares it."""
    if first is None or second is None:
        return first or second
    return PlanLayouts(
        second.input_claims or first.input_claims,
        second.output_claims or first.output_claims,
        second.outputs or first.outputs,
    )


def _names(layouts: object) -> tuple[str | None, ...]:
    if layouts is None:
        return ()
    if not isinstance(layouts, tuple | list):
        layouts = (layouts,)
    return tuple(placement_name(p) for p in layouts)


def placement_name(placement: object) -> str | None:
    """`Replicate()`, `Partial()`, `Shard(d)` as a plan writes them (a strided shard is a shard of
    its dim); None for no placement, or one this does not know."""
    if placement is None:
        return None
    kind = type(placement).__name__
    if kind == "Replicate":
        return "Replicate()"
    if kind == "Partial" or kind.endswith("Partial"):
        op = getattr(placement, "reduce_op", "sum")
        return "Partial()" if op == "sum" else f'Partial("{op}")'
    dim = getattr(placement, "dim", None)
    if isinstance(dim, int) and "Shard" in kind:
        return f"Shard({dim})"
    return None
