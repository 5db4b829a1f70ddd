"""Rules about convolutions (family `matmul`): the capture writes a depthwise convolution and a
dense one (one group) as operations of their own (capture/lower_functions.py `op_convolution`), a
dense one's bias added after, per channel, as a linear's is. A convolution computes each output
channel from its own filter (and, depthwise, its own input channel), and sums over its input
channels: blocks of channels relate as blocks of the output, or as partial sums.
"""

from __future__ import annotations

from .rules import Rule, registrar

CONVOLUTION_RULES: list[Rule] = []

_rule = registrar(CONVOLUTION_RULES)

_DEPTHWISE = '"shardproof::depthwise_convolution#0"'
_rule(
    "depthwise-convolution-of-channel-blocks",
    "matmul",
    "a depthwise convolution computes each channel from that channel's input, filter and bias alone: "
    "a block of the channels of all three gives that block of the output's channels (Mamba's conv1d "
    "on a rank's channels)",
    f"(rule ((= Y (Op3 {_DEPTHWISE} X W B a)) (= y (Op3 {_DEPTHWISE} x w b a)) (sel X x dx R) "
    "(= dx (- 1 (nd X))) (sel W w dw R) (= dw (- 0 (nd W))) (sel B b -1 R)) ((sel Y y dx R)))",
)
_rule(
    "depthwise-convolution-without-bias-of-channel-blocks",
    "matmul",
    "the same without a bias",
    f"(rule ((= Y (Op2 {_DEPTHWISE} X W a)) (= y (Op2 {_DEPTHWISE} x w a)) (sel X x dx R) "
    "(= dx (- 1 (nd X))) (sel W w dw R) (= dw (- 0 (nd W)))) ((sel Y y dx R)))",
)
_CONVOLUTION = '"shardproof::convolution#0"'
_rule(
    "convolution-without-bias-of-output-channel-blocks",
    "matmul",
    "a convolution computes each output channel from its own filter: a block of the filters gives that block "
    "of the output's channels (a patch embedding split column-parallel; a bias is added after, per channel)",
    f"(rule ((= Y (Op2 {_CONVOLUTION} X W a)) (= y (Op2 {_CONVOLUTION} X w a)) (sel W w dw R) "
    "(= dw (- 0 (nd W))) (= dx (- 1 (nd X)))) ((sel Y y dx R)))",
)
_rule(
    "convolution-of-input-channel-blocks",
    "matmul",
    "a convolution sums over its input channels: a block of them, with the filters' block of input channels, "
    "is that block's contribution (a convolution split row-parallel, its partial sums all-reduced)",
    f"(rule ((= Y (Op2 {_CONVOLUTION} X W a)) (= y (Op2 {_CONVOLUTION} x w a)) (sel X x dx (RCons s e (RNil))) "
    "(= dx (- 1 (nd X))) (sel W w dw (RCons s e (RNil))) (= dw (- 1 (nd W))) (= K (sz X dx))) "
    "((psum Y y s e K)))",
)
