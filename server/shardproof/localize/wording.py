"""How the localizer names operations and which ops it follows (shared by every detector)."""

from __future__ import annotations

from ..graph.model import Node

_LINEAR_OPS = {
    ("binary", "add"),
    ("binary", "sub"),
    ("scalar", "mul"),
    ("scalar", "div"),
    ("unary", "neg"),
    ("view", None),
    ("permute", None),
    ("slice", None),
    ("cat", None),
    ("expand", None),
}
_ROLES = {
    "sdpa": ["query", "key", "value", "mask"],
    "linear": ["input", "weight"],
    "matmul": ["left", "right"],
    "embedding": ["weight", "ids"],
}
_SUPPORTED = {
    "slice",
    "cat",
    "view",
    "permute",
    "expand",
    "unary",
    "scalar",
    "binary",
    "where",
    "fill",
    "reduce",
    "softmax",
    "log_softmax",
    "linear",
    "matmul",
    "embedding",
    "sdpa",
    "constant",
    "uninitialized",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
}


def _fn(node: Node) -> str | None:
    return node.attrs.get("fn") if node.op in ("unary", "scalar", "binary", "reduce") else None


_OP_NAMES = {
    "linear": "linear",
    "matmul": "matmul",
    "embedding": "embedding lookup",
    "sdpa": "attention",
    "view": "reshape",
    "permute": "transpose",
    "slice": "slice",
    "cat": "concatenation",
    "expand": "expand",
    "where": "where",
    "fill": "masked_fill",
    "softmax": "softmax",
    "log_softmax": "log_softmax",
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "broadcast": "broadcast",
    "constant": "constant",
}


# operations the capture writes out as their parts (capture/decompose.py): a part is named as
# part of the operation the user called
_CALLED_AS = {"aten::scaled_dot_product_attention": "the attention"}


def describe_op(node: Node) -> str:
    """A short human name: `silu`, `add`, `linear layers.0.attention.wo`, `attention`, `matmul
    in the attention`."""
    called = _CALLED_AS.get(str(node.attrs.get("within", "")))
    name = _describe_op(node)
    return f"{name} in {called}" if called else name


def _describe_op(node: Node) -> str:
    fn = _fn(node)
    if node.op == "generic":
        target = str(node.attrs.get("target", "op")).replace("aten::", "")
        # our own operations by what they are (shardproof::depthwise_convolution: depthwise convolution)
        return target.removeprefix("shardproof::").replace("_", " ") if target.startswith("shardproof::") else target
    if node.op == "scalar":
        value = node.attrs.get("value")
        if isinstance(value, float) and len(repr(value)) > 10:
            value = f"{value:.6g}"  # 0.353553, not 0.35355339059327373
        if fn == "div" and node.original.startswith("aten::mean"):
            return f"mean (the division by {value})"  # a mean is captured as a sum and this division
        return f"{fn} by {value}"
    if node.op == "reduce":
        return str(fn)
    name = str(fn) if fn else _OP_NAMES.get(node.op, node.op)
    if fn and fn.startswith("cast_"):
        name = f"cast to {fn.removeprefix('cast_')}"
    if node.op in ("linear", "embedding") and node.module_path:
        return f"{name} {node.module_path}"
    return name
