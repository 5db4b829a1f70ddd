"""Meta operations answered from an earlier equal call (capture/meta_ops.py) give what the kernel
gives, and only where the kernel's answer is a function of metadata."""

from __future__ import annotations

import torch

from shardproof.capture import meta_ops


def _metadata(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return (type(value), tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device)
    if isinstance(value, tuple | list):
        return [_metadata(v) for v in value]
    return value


def _twice(func: object, *args: object, **kwargs: object) -> tuple[object, object]:
    first = meta_ops.run(func, args, kwargs)
    return first, meta_ops.run(func, args, kwargs)


def test_a_repeated_call_gives_fresh_results_with_the_kernels_metadata() -> None:
    x = torch.empty(4, 6, device="meta").t()  # not contiguous
    w = torch.empty(3, 4, device="meta", dtype=torch.bfloat16)
    cases = [
        (torch.ops.aten.mm.default, (x, torch.empty(4, 5, device="meta")), {}),
        (torch.ops.aten.mul.Tensor, (x, 0.5), {}),
        (torch.ops.aten._to_copy.default, (w,), {"dtype": torch.float32}),
        (torch.ops.aten.native_layer_norm.default, (x, [4], None, None, 1e-5), {}),
        (torch.ops.aten.sum.dim_IntList, (x, [-1], True), {}),
    ]
    for func, args, kwargs in cases:
        first, again = _twice(func, *args, **kwargs)
        assert _metadata(again) == _metadata(first) == _metadata(func(*args, **kwargs)), func
        pairs = zip(first, again, strict=True) if isinstance(first, tuple) else [(first, again)]
        for a, b in pairs:
            assert a.untyped_storage()._cdata != b.untyped_storage()._cdata  # fresh memory each time


def test_views_writes_and_data_are_always_computed() -> None:
    x = torch.empty(4, 6, device="meta")
    _, again = _twice(torch.ops.aten.view.default, x, [6, 4])
    assert again.untyped_storage()._cdata == x.untyped_storage()._cdata  # still a view of x
    written, _ = _twice(torch.ops.aten.add_.Tensor, x, 1.0)
    assert written is x
    data = torch.arange(6.0)  # on the CPU its values matter
    _, doubled = _twice(torch.ops.aten.mul.Tensor, data, 2.0)
    assert doubled.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_the_default_dtype_is_part_of_the_call() -> None:
    before = torch.get_default_dtype()
    try:
        made = meta_ops.run(torch.ops.aten.ones.default, ([3],), {"device": torch.device("meta")})
        torch.set_default_dtype(torch.float64)
        again = meta_ops.run(torch.ops.aten.ones.default, ([3],), {"device": torch.device("meta")})
    finally:
        torch.set_default_dtype(before)
    assert (made.dtype, again.dtype) == (torch.float32, torch.float64)
