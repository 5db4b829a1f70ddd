"""Check a derived law (op_laws.py) on concrete tensors before any proof relies on it.

The op runs on random full inputs of the reference call's shapes, and on the pieces each rank of
a world would hold under the law's placements; the law holds when the ranks' results relate to
the full result as it claims:

- `Shard` inputs -> `Shard` output: each rank's result is the same selection of the full
  result. The rule accepts any range list, so besides the even and uneven blocks of worlds of 2
  and 3 ranks a list of two separate ranges is tried.
- `Shard` inputs -> `Partial` output: the ranks' results add up to the full result (blocks that
  tile the sharded dim, even and uneven).
- a `Partial` input -> `Partial` output: random terms that add up to the input give results that
  add up to the full result.

Integer inputs (indices, offsets, counts) are drawn in [0, m) for m the smallest dim of the call,
then sorted if the op refuses them (offsets); an op that runs on no draw has no checked law.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .op_laws import Call, Law

TRIALS = 2
WORLDS = (2, 3)


def check_law(call: Call, law: Law) -> str | None:
    """None when the law held on every trial, else what went wrong (never raises: a check that
    cannot be made is a law that is not kept)."""
    try:
        return _check(call, law)
    except Exception as exc:  # noqa: BLE001 - any failure of the check excludes the law
        return f"the check could not be made: {type(exc).__name__}: {exc}"


def _check(call: Call, law: Law) -> str | None:
    import torch

    generator = torch.Generator().manual_seed(0)
    for trial in range(TRIALS):
        inputs = _inputs(call, generator, sort=False)
        full = _run(call, inputs)
        if full is None:
            inputs = _inputs(call, generator, sort=True)
            full = _run(call, inputs)
        if full is None:
            return "the op does not run on random inputs of the reference's shapes"
        for pieces in _worlds(law, call, inputs, generator, trial):
            problem = _compare(call, law, full, pieces)
            if problem is not None:
                return problem
    return None


def _inputs(call: Call, generator: Any, sort: bool) -> list[Any]:
    import torch

    sizes = [s for meta in call.metas for s in meta.shape if s > 1] or [2]
    bound = min(sizes)
    tensors = []
    for meta in call.metas:
        if meta.dtype.startswith(("float", "bfloat")):
            tensors.append(torch.randn(meta.shape, generator=generator, dtype=torch.float64))
        elif meta.dtype == "bool":
            tensors.append(torch.randint(0, 2, meta.shape, generator=generator).bool())
        else:
            values = torch.randint(0, bound, meta.shape, generator=generator, dtype=getattr(torch, meta.dtype))
            if sort and values.ndim == 1:
                values = values.sort().values
            tensors.append(values)
    return tensors


def _run(call: Call, tensors: list[Any]) -> Any | None:
    import torch

    try:
        with torch.no_grad():
            out = call.run(tensors)
    except Exception:  # noqa: BLE001 - any refusal means "not on these inputs"
        return None
    return out if isinstance(out, torch.Tensor) else None


def _worlds(law: Law, call: Call, inputs: list[Any], generator: Any, trial: int) -> list[list[tuple[Any, list[Any]]]]:
    """For each world tried, each rank's positions of the sharded dims (None without) and inputs."""
    import torch

    sharded = [i for i, p in enumerate(law.inputs) if p.kind == "S"]
    worlds: list[list[tuple[Any, list[Any]]]] = []
    if sharded:
        size = inputs[sharded[0]].shape[law.inputs[sharded[0]].dim]
        for world in WORLDS:
            if size < world:
                continue
            bounds = _blocks(size, world, uneven=trial % 2 == 1)
            worlds.append([(torch.arange(s, e), _select(law, inputs, torch.arange(s, e))) for s, e in bounds])
        if law.output.kind == "S" and size >= 4:
            # two separate ranges, as a fused weight's rank holds: [0, 1) and [size - 2, size)
            index = torch.tensor([0, size - 2, size - 1])
            worlds.append([(index, _select(law, inputs, index))])
        return worlds
    (partial,) = [i for i, p in enumerate(law.inputs) if p.kind == "P"]
    whole = inputs[partial]
    if whole.dtype == torch.bool:
        raise ValueError("a partial sum of booleans")  # calls of one symbol may differ in dtype
    for world in WORLDS:
        terms = [_term_like(whole, generator) for _ in range(world - 1)]
        terms.append(inputs[partial] - sum(terms))
        worlds.append([(None, [term if i == partial else t for i, t in enumerate(inputs)]) for term in terms])
    return worlds


def _term_like(whole: Any, generator: Any) -> Any:
    """A random term of a sum: floats, or small integers (integer sums are exact too)."""
    import torch

    if whole.is_floating_point():
        return torch.randn(whole.shape, generator=generator, dtype=whole.dtype)
    return torch.randint(-5, 6, whole.shape, generator=generator, dtype=whole.dtype)


def _blocks(size: int, world: int, uneven: bool) -> list[tuple[int, int]]:
    if uneven and size > world:
        cuts = [0, 1] + [1 + (size - 1) * r // (world - 1) for r in range(1, world)]
        return list(itertools.pairwise(cuts))
    cuts = [size * r // world for r in range(world + 1)]
    return list(itertools.pairwise(cuts))


def _select(law: Law, inputs: list[Any], index: Any) -> list[Any]:
    return [t.index_select(p.dim, index) if p.kind == "S" else t for t, p in zip(inputs, law.inputs, strict=True)]


def _compare(call: Call, law: Law, full: Any, ranks: list[tuple[Any, list[Any]]]) -> str | None:
    results = [_run(call, piece) for _, piece in ranks]
    if any(r is None for r in results):
        return "the op refuses a rank's inputs"
    if law.output.kind == "P":
        if len(ranks) == 1:
            return None
        if any(r.shape != full.shape for r in results):
            return "a rank's result is not of the full result's shape (a partial sum is)"
        total = sum(results)
        return None if _close(total, full) else "the ranks' results do not add up to the full result"
    for (index, _), result in zip(ranks, results, strict=True):
        expected = full.index_select(law.output.dim, index)
        if result.shape != expected.shape or not _close(result, expected):
            return f"a rank's result is not its selection of the full result along dim {law.output.dim}"
    return None


def _close(a: Any, b: Any) -> bool:
    import torch

    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        return torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-8)
    return torch.equal(a, b)
