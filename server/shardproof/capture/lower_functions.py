"""Functions of whole fibers or layers: rms_norm as torch decomposes it, attention, softmax and
log_softmax, ops along one dim (topk, sort, cumsum), clamp."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..graph.model import TensorMeta
from ..relations.expr import norm_dim
from . import decompose
from .lowering_tables import _ALONG, _literal


class FunctionLowering:
    """Lowerings of the normalizer (`normalize._Builder`), by the op they handle (`op_<name>`)."""

    def op_rms_norm(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """`rms_norm` written out as torch's own decomposition does (pow, mean, add eps, rsqrt,
        mul, mul weight, in float32 for half inputs), so a reference calling `nn.RMSNorm` and a
        parallel program decomposed to core aten (DTensor) meet in the same operations."""
        normalized_shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        eps = args[3] if len(args) > 3 else kwargs.get("eps")
        if not isinstance(normalized_shape, list | tuple) or len(normalized_shape) != 1:
            return False
        source = self.value(args[0])
        src_meta = self.meta(source)
        upcast = "float32" if src_meta.dtype in ("float16", "bfloat16") else src_meta.dtype
        if eps is None:
            eps = torch.finfo(torch.float32 if upcast == "float32" else torch.float64).eps
        wide = TensorMeta(src_meta.shape, upcast)
        kept = TensorMeta((*src_meta.shape[:-1], 1), upcast)
        if upcast != src_meta.dtype:
            source = self.add(fx, "unary", [source], {"fn": f"cast_{upcast}"}, wide, suffix=".upcast")
        squared = self.add(fx, "scalar", [source], {"fn": "pow", "value": 2}, wide, suffix=".square")
        # the mean as sum / width, as `_reduce` writes every mean
        total = self.add(fx, "reduce", [squared], {"fn": "sum", "dim": -1, "keepdim": True}, kept, suffix=".sum")
        mean = self.add(fx, "scalar", [total], {"fn": "div", "value": src_meta.shape[-1]}, kept, suffix=".mean")
        shifted = self.add(fx, "scalar", [mean], {"fn": "add", "value": _literal(eps)}, kept, suffix=".eps")
        inverse = self.add(fx, "unary", [shifted], {"fn": "rsqrt"}, kept, suffix=".rsqrt")
        steps: list[tuple[str, list[str], dict[str, Any]]] = [("binary", [source, inverse], {"fn": "mul"})]
        if isinstance(weight, torch.fx.Node):
            steps.append(("binary", ["<previous>", self.value(weight)], {"fn": "mul"}))
        if upcast != meta.dtype:
            steps.append(("unary", ["<previous>"], {"fn": f"cast_{meta.dtype}"}))
        previous = ""
        for i, (op, inputs, attrs) in enumerate(steps):
            last = i == len(steps) - 1
            inputs = [previous if value == "<previous>" else value for value in inputs]
            previous = self.add(fx, op, inputs, attrs, meta if last else wide, suffix="" if last else f".step{i}")
        return True

    def op_scaled_dot_product_attention(
        self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta
    ) -> bool:
        """Attention written out as its documented math (decompose.py `_attention`): every step
        is an operation the rules follow on heads, so a reference calling `F.scaled_dot_product_attention`
        and a program that writes attention out by hand (einsum, scale, masked_fill, softmax) meet
        in the same operations. With an explicit mask it stays one operation."""
        if decompose.inline(self, fx):
            return True
        q, k, v = (self.value(a) for a in args[:3])
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
        if dropout not in (0, 0.0):
            return False
        attrs = {
            "is_causal": bool(args[5] if len(args) > 5 else kwargs.get("is_causal", False)),
            "scale": _literal(kwargs.get("scale", args[6] if len(args) > 6 else None)),
            "enable_gqa": bool(kwargs.get("enable_gqa", args[7] if len(args) > 7 else False)),
        }
        inputs = [q, k, v] + ([self.value(mask)] if isinstance(mask, torch.fx.Node) else [])
        self.add(fx, "sdpa", inputs, attrs, meta)
        return True

    def op_softmax(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """Written out as torch decomposes it (the max, the exponentials of the differences, their
        sum, the quotient): a softmax over a sharded dim is then the vocabulary-parallel softmax
        (a max all-reduce and a sum all-reduce) its ranks compute. A softmax whose decomposition
        cannot be traced stays one operation."""
        if decompose.inline(self, fx):
            return True
        source = self.value(args[0])
        self.add(fx, "softmax", [source], {"dim": norm_dim(args[1], meta.ndim)}, meta)
        return True

    op__softmax = op_softmax

    def op_log_softmax(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """Written out as torch decomposes it (x - max - log(sum(exp(x - max)))), as `op_softmax`:
        over a sharded dim it is then what DTensor's `loss_parallel()` and Megatron compute."""
        if decompose.inline(self, fx):
            return True
        source = self.value(args[0])
        self.add(fx, "log_softmax", [source], {"dim": norm_dim(args[1], meta.ndim)}, meta)
        return True

    op__log_softmax = op_log_softmax

    def op_argmax(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        return self._index_of_extreme(fx, "argmax", args, kwargs, meta)

    def op_argmin(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        return self._index_of_extreme(fx, "argmin", args, kwargs, meta)

    def _index_of_extreme(
        self, fx: torch.fx.Node, fn: str, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta
    ) -> bool:
        """argmax / argmin along one dim: a reduction of each fiber along it to the position of
        its extreme (the first one), so a selection of any other dim commutes with it, as with
        every reduction (written by the normalizer's `reduction`). Along no dim (the flattened
        value's position) it stays torch's."""
        if (args[1] if len(args) > 1 else kwargs.get("dim")) is None:
            return False
        self.reduction(fx, fn, args, kwargs, meta)
        return True

    # -- ops along one dim, clamp -------------------------------------------------------------
    def along(
        self,
        fx: torch.fx.Node,
        name: str,
        args: list[Any],
        kwargs: dict[str, Any],
        meta: TensorMeta,
        index: int = 0,
        suffix: str = "",
    ) -> str:
        """An op that maps every 1-d fiber along `dim` on its own (the dim's size may change):
        a selection of any other dim commutes with it."""
        source = self.value(args[0])
        position = _ALONG[name]
        dim = args[position] if len(args) > position else kwargs.get("dim", -1)
        dim = norm_dim(dim, self.meta(source).ndim)
        rest = [_literal(a) for i, a in enumerate(args[1:], start=1) if i != position]
        rest += [[key, _literal(value)] for key, value in sorted(kwargs.items()) if key != "dim"]
        attrs = {"fn": name, "dim": dim, "index": index, "args": rest}
        return self.add(fx, "along", [source], attrs, meta, suffix=suffix)

    def op_convolution(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        """A depthwise convolution (one filter per channel: Mamba's conv1d, ConvNeXt's 7x7) as an
        operation of its own, `shardproof::depthwise_convolution`, without the group count (it is
        the number of channels): a rank convolving its block of the channels with its block of
        the filters is then the same operation as the reference's on fewer channels, and a rule
        (`depthwise-convolution-of-channel-blocks`) relates the two. A dense convolution (one
        group) likewise as `shardproof::convolution`: a block of its filters gives that block of
        the output's channels, a block of the input's channels with those of the filters a partial
        sum (`convolution-without-bias-of-output-channel-blocks`, `convolution-of-input-channel-
        blocks`: a patch embedding or a convolutional layer split column- or row-parallel), its bias
        added after, per channel. Any other convolution stays torch's."""
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
        bound = dict(zip(names, args, strict=False)) | kwargs
        source, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
        if not isinstance(source, torch.fx.Node) or not isinstance(weight, torch.fx.Node) or bound.get("transposed"):
            return False
        channels = self.meta(self.value(source)).shape[1]
        filters = self.meta(self.value(weight)).shape
        groups = bound.get("groups", 1)
        if groups == 1 and filters[1] == channels:
            target = "shardproof::convolution"
        elif groups == channels and filters[0] == channels and filters[1] == 1:
            target = "shardproof::depthwise_convolution"
        else:
            return False
        inputs = [self.value(source), self.value(weight)]
        literal = [[int(v) for v in bound.get(key, ())] for key in ("stride", "padding", "dilation")]
        attrs = {"target": target, "args": literal, "kwargs": [], "index": 0}
        if isinstance(bias, torch.fx.Node) and target == "shardproof::convolution":
            # the bias added after, as a linear's is: a row-parallel rank adds it once, after its sum
            product = self.add(fx, "generic", inputs, attrs, meta, suffix=".nobias")
            spread = (meta.shape[1],) + (1,) * (len(meta.shape) - 2)
            per_channel = self.view(fx, self.value(bias), TensorMeta(spread, meta.dtype), suffix=".bias")
            self.add(fx, "binary", [product, per_channel], {"fn": "add"}, meta)
            return True
        if isinstance(bias, torch.fx.Node):
            inputs.append(self.value(bias))
        self.add(fx, "generic", inputs, attrs, meta)
        return True

    def op_cumsum(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        self.along(fx, "cumsum", args, kwargs, meta)
        return True

    def op_clamp(self, fx: torch.fx.Node, args: list[Any], kwargs: dict[str, Any], meta: TensorMeta) -> bool:
        low = args[1] if len(args) > 1 else kwargs.get("min")
        high = args[2] if len(args) > 2 else kwargs.get("max")
        if any(isinstance(bound, torch.fx.Node) for bound in (low, high)) or (low is None and high is None):
            return False
        value = self.value(args[0])
        if low is not None:
            attrs = {"fn": "maximum", "value": _literal(low)}
            value = self.add(fx, "scalar", [value], attrs, meta, suffix=".min" if high is not None else "")
        if high is not None:
            self.add(fx, "scalar", [value], {"fn": "minimum", "value": _literal(high)}, meta)
        return True
