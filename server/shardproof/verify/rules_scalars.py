"""Rules about scaling by a constant (family `normalization`, shapes in `shapes`): a scaling
commutes with the linear maps it passes through, and two scalings are one.

Attention is written with its scale in many places: on the scores (`q @ k^T * scale`, what
`scaled_dot_product_attention` documents), on the queries first (`q = q * scale`, then
`q @ k^T`), on the transposed keys (`q @ (k^T / sqrt(d))`), or a square root of it on both (the
queries and the keys times `d ** -0.25`). They are one function, by two laws of real arithmetic:
a matrix product, a linear map and a permutation are linear in each operand, so a scaled operand
gives the scaled result; and scaling by a then by b is scaling by a * b. The products of the
float factors a program uses are facts the encoder states (`scprod`, `scprodrecip`: scalars.py
writes the product as its own term would be written), and so are the products of its integer
factors (`scintprod`): never computed in egglog, where a value equal to itself divided by a number
(a constant 0) would make ever larger divisors.
"""

from __future__ import annotations

from .rules import Rule, registrar

SCALAR_RULES: list[Rule] = []

_rule = registrar(SCALAR_RULES)

for _term in ("Sc", "ScI"):
    _kind = "float" if _term == "Sc" else "integer"
    _rule(
        f"scaled-negation-is-negated-scaling-{_kind}",
        "normalization",
        "(-z) * c = -(z * c), and so for a division by c: a scaling is linear (a smoothing term `eps * (c - b)` "
        "subtracted where another program adds `eps * (b - c)`)",
        f'(rule ((= y ({_term} f n c)) (= n (Un "neg" z)) (scaling f)) ((union y (Un "neg" ({_term} f z c)))))',
    )
    _rule(
        f"product-with-scaled-factor-{_kind}",
        "normalization",
        "(a * c) * b = (a * b) * c and a * (b * c) = (a * b) * c, for a scaling by a literal c (`coef * lse * lse` "
        "where another program writes `coef * lse.square()`); stated at products a program computes",
        f'(rule ((= y (Bin "mul" s b)) (= s ({_term} f a c)) (scaling f) (node y v)) '
        f'((union y ({_term} f (Bin "mul" a b) c))))',
    )
    _rule(
        f"product-with-scaled-second-factor-{_kind}",
        "normalization",
        "a * (b * c) = (a * b) * c for a scaling by a literal c; stated at products a program computes",
        f'(rule ((= y (Bin "mul" a s)) (= s ({_term} f b c)) (scaling f) (node y v)) '
        f'((union y ({_term} f (Bin "mul" a b) c))))',
    )
    _rule(
        f"scaled-left-operand-of-matmul-{_kind}",
        "normalization",
        "(A * c) @ B = (A @ B) * c: a matrix product is linear in its left operand (queries scaled before the scores)",
        f"(rule ((= y (Matmul ({_term} f A c) B)) (scaling f)) ((union y ({_term} f (Matmul A B) c))))",
    )
    _rule(
        f"scaled-right-operand-of-matmul-{_kind}",
        "normalization",
        "A @ (B * c) = (A @ B) * c: a matrix product is linear in its right operand (keys scaled before the scores)",
        f"(rule ((= y (Matmul A ({_term} f B c))) (scaling f)) ((union y ({_term} f (Matmul A B) c))))",
    )
    _rule(
        f"scaled-input-of-linear-{_kind}",
        "normalization",
        "linear(x * c, W) = linear(x, W) * c (no bias: the map is linear)",
        f"(rule ((= y (Linear ({_term} f X c) W)) (scaling f)) ((union y ({_term} f (Linear X W) c))))",
    )
    _rule(
        f"scaled-weight-of-linear-{_kind}",
        "normalization",
        "linear(x, W * c) = linear(x, W) * c: a linear map is linear in its weight too (a scaled weight, LoRA's "
        "scaling)",
        f"(rule ((= y (Linear X ({_term} f W c))) (scaling f)) ((union y ({_term} f (Linear X W) c))))",
    )
    _rule(
        f"permute-of-scaled-{_kind}",
        "normalization",
        "(A op c).permute(p) = A.permute(p) op c for any elementwise op with a constant: a permutation moves "
        "the entries",
        f"(rewrite (Permute ({_term} f A c) p) ({_term} f (Permute A p) c))",
    )
    _rule(
        f"shape-of-scaled-{_kind}",
        "shapes",
        "a scaling keeps the shape (of the scaled value made by a rule, from its result's)",
        f"(rule ((= y ({_term} f x c)) (= n (sz y d))) ((set (sz x d) n)))",
    )
    _rule(
        f"rank-of-scaled-{_kind}",
        "shapes",
        "a scaling keeps the number of dims",
        f"(rule ((= y ({_term} f x c)) (= n (nd y))) ((set (nd x) n)))",
    )

_rule(
    "scaling-of-scaling",
    "normalization",
    "(X * a) * b = X * c with c = a * b (as the product's own term writes it: the encoder's scprod facts)",
    '(rule ((= y (Sc "mul" (Sc "mul" X a) b)) (scprod a b c)) ((union y (Sc "mul" X c))))',
)
_rule(
    "scaling-of-scaling-reciprocal",
    "normalization",
    "(X * a) * b = X / n when a * b is 1 / n (the encoder's scprodrecip facts)",
    '(rule ((= y (Sc "mul" (Sc "mul" X a) b)) (scprodrecip a b n)) ((union y (ScI "div" X n))))',
)
_rule(
    "division-of-division",
    "normalization",
    "(X / a) / b = X / c with c = a * b for integers a, b (the encoder's scintprod facts: products of the "
    "program's own integer factors only, so a value equal to itself divided by a number, a constant 0, "
    "cannot make ever larger divisors)",
    '(rule ((= y (ScI "div" (ScI "div" X a) b)) (scintprod a b c)) ((union y (ScI "div" X c))))',
)
_rule(
    "scaling-by-one",
    "normalization",
    "X * 1 = X and X / 1 = X (a multiplier left at its default; a partial sum times 1 before its all-reduce)",
    "(rule ((= y (ScI f X 1)) (scaling f)) ((union y X)))",
)
_rule(
    "square-is-product",
    "normalization",
    "X ** 2 = X * X (a variance written with pow where the reference's decomposition multiplies the centered "
    "value by itself: LayerNorm's var_mean)",
    '(rule ((= y (ScI "pow" X 2))) ((union y (Bin "mul" X X))))',
)
_rule(
    "division-undoes-multiple",
    "normalization",
    "(X * a) / a = X for a nonzero integer a (a rank that scales its partial sum before the all-reduce and "
    "scales it back after)",
    '(rewrite (ScI "div" (ScI "mul" X a) a) X :when ((!= a 0)))',
)
_rule(
    "multiple-undoes-division",
    "normalization",
    "(X / a) * a = X for a nonzero integer a (a rank that divides its partial sum by the world size before "
    "the all-reduce and multiplies it back after)",
    '(rewrite (ScI "mul" (ScI "div" X a) a) X :when ((!= a 0)))',
)
_rule(
    "multiple-of-multiple",
    "normalization",
    "(X * a) * b = X * c with c = a * b for integers a, b (the encoder's scintprod facts)",
    '(rule ((= y (ScI "mul" (ScI "mul" X a) b)) (scintprod a b c)) ((union y (ScI "mul" X c))))',
)

for _term in ("Sc", "ScI"):
    _kind = "float" if _term == "Sc" else "integer"
    _rule(
        f"not-of-equal-is-not-equal-{_kind}",
        "elementwise",
        "not (x == c) is x != c, NaN included (torch's ignored targets `target == -100`, negated for the tokens "
        "a loss counts, against a loss mask written `target != -100`)",
        f'(rule ((= y (Un "logical_not" ({_term} "eq" x c)))) ((union y ({_term} "ne" x c))))',
    )
    _rule(
        f"not-of-not-equal-is-equal-{_kind}",
        "elementwise",
        "not (x != c) is x == c, NaN included",
        f'(rule ((= y (Un "logical_not" ({_term} "ne" x c)))) ((union y ({_term} "eq" x c))))',
    )
