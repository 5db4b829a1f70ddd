"""Laws of indexing along one dim, for the indexing ops DTensor has no strategy for.

`x[..., idx, ...]` (`index.Tensor`) and its writes (`index_put`, `x[:, :, pos] = v`: a KV cache
filled at the positions of the tokens) read or write along the one dim the index tensor names and
act position by position along every other dim: the rank's block of `x` along another dim gives
the same block of the result, when the values written are that block of theirs too (or broadcast
along the dim). DTensor (torch 2.13) has no sharding strategy for these ops, so op_laws.py asks
this module for them as candidates; each is then checked on concrete tensors like DTensor's
(law_check.py) before it becomes a rule.

Only one index tensor, of integers: with several, the indexed dims may move to the front; a
boolean index is a mask, whose result has as many rows as it has true entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .op_laws import Law, Placement

if TYPE_CHECKING:
    from .op_laws import Call

_READS = ("index", "_unsafe_index")
_WRITES = ("index_put", "_unsafe_index_put")
_INTEGER = ("int64", "int32")


def indexing_laws(call: Call) -> list[Law]:
    """One law per dim of the indexed tensor other than the indexed one (and not of size 1)."""
    name = getattr(getattr(call.op, "overloadpacket", None), "__name__", "")
    writes = name in _WRITES
    if name not in _READS + _WRITES or len(call.args) < 2 or not isinstance(call.args[1], list):
        return []
    indices = call.args[1]
    given = [dim for dim, index in enumerate(indices) if index is not None]
    if len(given) != 1 or indices[given[0]] != "<tensor>" or len(call.metas) != (3 if writes else 2):
        return []
    (indexed_dim,) = given
    source, index = call.metas[0], call.metas[1]
    if index.dtype not in _INTEGER:
        return []
    nd = source.ndim
    # the shape the index reads (and a write's values broadcast to): the indexed dim replaced by
    # the index's dims, in place
    read = (*source.shape[:indexed_dim], *index.shape, *source.shape[indexed_dim + 1 :])
    laws = []
    for dim in range(nd):
        if dim == indexed_dim or source.shape[dim] < 2:
            continue
        read_dim = dim if dim < indexed_dim else dim - 1 + index.ndim
        inputs = [Placement("S", dim - nd), Placement("R")]
        if writes:
            values = call.metas[2]
            value_dim = read_dim - (len(read) - values.ndim)  # broadcast from the right
            if value_dim < 0 or values.shape[value_dim] == 1:
                inputs.append(Placement("R"))
            elif values.shape[value_dim] == source.shape[dim]:
                inputs.append(Placement("S", value_dim - values.ndim))
            else:
                continue
            output = Placement("S", dim - nd)
        else:
            output = Placement("S", read_dim - len(read))
        laws.append(Law(str(call.op.name()), tuple(inputs), output))
    return laws
