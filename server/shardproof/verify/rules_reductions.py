"""Rules about values reduced over ranks: vocabulary-parallel lookups (the family `embedding`),
partial sums, shares and the covers of an all-reduce (`partial`) and vocabulary-parallel losses
(`loss`). See rules.py for the library and language.py for what each relation means."""

from __future__ import annotations

from .rules import Rule, registrar

REDUCTION_RULES: list[Rule] = []


_rule = registrar(REDUCTION_RULES)


# ---------------------------------------------------------------------------------------------
# embedding: vocab-parallel lookups
# ---------------------------------------------------------------------------------------------
_rule(
    "embedding-columns",
    "embedding",
    "embedding(ids, W[:, R]) = embedding(ids, W)[..., R]",
    "(rule ((= Y (Emb W I)) (= y (Emb w I)) (sel W w -1 R)) ((sel Y y -1 R)))",
)
_rule(
    "embedding-rows-of-ids",
    "embedding",
    "rows of the ids map to rows of the lookup",
    "(rule ((= Y (Emb W I)) (= y (Emb W i)) (sel I i d R)) ((sel Y y (- d 1) R)))",
)
_rule(
    "embedding-backward-of-token-rows",
    "embedding",
    "the embedding gradient of a block of token rows (their output gradients and ids) is that block's "
    "contribution to the embedding gradient of all tokens",
    '(rule ((= Y (Op2 "aten::embedding_dense_backward#0" G I p)) (= y (Op2 "aten::embedding_dense_backward#0" g i p)) '
    "(sel G g d (RCons s e (RNil))) (sel I i d2 (RCons s e (RNil))) (= d (- d2 1)) (= K (sz I d2))) "
    "((psum Y y s e K)))",
)
# A comparison of shifted ids is one of the ids with the bound shifted alike: a rank that takes
# its local ids first (`local = ids - start`) and tests `(local >= 0) & (local < n)` compares the
# ids with [start, start + n), which the mask rules read.
for _f in ("lt", "le", "gt", "ge", "eq", "ne"):
    _rule(
        f"{_f}-of-shifted",
        "embedding",
        f"{_f}(x - s, c) = {_f}(x, c + s): shifting both sides of a comparison keeps it",
        f'(rule ((= y (ScI "{_f}" (ScI "sub" I s) c))) ((union y (ScI "{_f}" I (+ c s)))))',
    )
_rule(
    "vocab-mask",
    "embedding",
    "(ids < s) | (ids >= e) marks ids outside [s, e)",
    '(rule ((= m (Bin "or" (ScI "lt" I s) (ScI "ge" I e)))) ((outside m I s e)))',
)
_rule(
    "vocab-mask-swapped",
    "embedding",
    "(ids >= e) | (ids < s) marks ids outside [s, e)",
    '(rule ((= m (Bin "or" (ScI "ge" I e) (ScI "lt" I s)))) ((outside m I s e)))',
)
_rule(
    "vocab-local-ids",
    "embedding",
    "ids - s with the outside ids zeroed index the local shard",
    '(rule ((= l (Fill (ScI "sub" I s) m "0.0")) (outside m I s e)) ((localids l I s e)))',
)
_rule(
    "vocab-local-lookup",
    "embedding",
    "looking the local ids up in rows [s, e) of W",
    "(rule ((= y0 (Emb w l)) (localids l I s e) (sel W w -2 (RCons s e (RNil))) (= Y (Emb W I)) (outside m I s e)) "
    "((embpart y0 Y m s e)))",
)
_rule(
    "vocab-clamped-local-lookup",
    "embedding",
    "ids - s clamped to [0, e - s - 1] index rows [s, e) of W for the ids inside [s, e), and some row of the "
    "shard for the others: looked up in the rank's rows, the ids inside get their rows (a vocabulary shard "
    "that clamps its local ids instead of masking them, the outside rows zeroed after)",
    '(rule ((= y0 (Emb w l)) (= l (ScI "minimum" (ScI "maximum" (ScI "sub" I s) 0) h)) '
    "(sel W w -2 (RCons s e (RNil))) (= h (- (- e s) 1)) (= Y (Emb W I)) (outside m I s e)) "
    "((embpart y0 Y m s e)))",
)
_rule(
    "vocab-masked-lookup-is-partial",
    "embedding",
    "zeroing the outside rows leaves the contribution of vocabulary [s, e) to the lookup",
    '(rule ((embpart y0 Y m s e) (= y (Fill y0 u "0.0")) (= u (View m sh)) (= k (nd m)) (= (+ k 1) (nd u)) '
    "(= 1 (sz u -1)) (= Y (Emb W I)) (= V (sz W -2))) ((psum Y y s e V)))",
)

_rule(
    "vocab-inside-mask",
    "embedding",
    "(ids >= s) & (ids < e) marks the ids inside [s, e) (vLLM's vocabulary mask)",
    '(rule ((= m (Bin "and" (ScI "ge" I s) (ScI "lt" I e)))) ((inside m I s e)))',
)
_rule(
    "vocab-inside-mask-swapped",
    "embedding",
    "(ids < e) & (ids >= s) marks the ids inside [s, e)",
    '(rule ((= m (Bin "and" (ScI "lt" I e) (ScI "ge" I s)))) ((inside m I s e)))',
)
_rule(
    "not-inside-is-outside",
    "embedding",
    "the negation of the inside mask marks the ids outside [s, e)",
    "(rule ((inside m I s e) (= n (Un f m)) (negation f)) ((outside n I s e)))",
)
_rule(
    "negation-of-viewed-mask",
    "embedding",
    "an elementwise op on a view of a mask (its negation) is the view of the op on the mask",
    "(rule ((= n (Un f u)) (= u (View m sh)) (inside m I s e) (= k (nd m))) "
    "((union n (View (Un f m) sh)) (set (nd (Un f m)) k)))",
)
_rule(
    "arithmetic-local-ids",
    "embedding",
    "mask * (ids - s * mask) with the inside mask of [s, e) is ids - s inside and 0 outside: the local ids "
    "(vLLM's get_masked_input_and_mask)",
    '(rule ((inside m I s e) (= l (Bin "mul" m (Bin "sub" I (ScI "mul" m s))))) ((localids l I s e)))',
)
_rule(
    "arithmetic-local-ids-filled",
    "embedding",
    "ids - s * mask zeroed outside the inside mask of [s, e) is ids - s inside and 0 outside: the local ids "
    "(vLLM's mask * (ids - s * mask), its product by the boolean mask written as that fill)",
    '(rule ((inside m I s e) (= l (Fill (Bin "sub" I (ScI "mul" m s)) n "0.0")) (= n (Un f m)) (negation f)) '
    "((localids l I s e)))",
)
_rule(
    "local-lookup-reads-its-rows",
    "embedding",
    "local ids of [s, e) are in [0, e - s): a lookup in a longer table (a vocabulary shard padded to a "
    "multiple of the world size, as vLLM pads it) reads only its first e - s rows",
    "(rule ((localids l I s e) (= y (Emb W l)) (= n (- e s)) (= k (sz W -2)) (< n k) (< 0 n)) "
    "((union y (Emb (Slice W -2 0 n) l))))",
)
_rule(
    "vocab-whole-range-lookup",
    "embedding",
    "local ids of the whole vocabulary [0, V) are the ids themselves (token ids index the vocabulary)",
    "(rule ((localids l I 0 e) (= y (Emb W l)) (= e (sz W -2))) ((union y (Emb W I))))",
)
_rule(
    "vocab-whole-range-mask",
    "embedding",
    "no id lies outside the whole vocabulary [0, V): zeroing the rows of outside ids changes nothing",
    '(rule ((outside m I 0 e) (= Y (Emb W I)) (= e (sz W -2)) (= y (Fill Y u "0.0")) (= u (View m sh))) ((union y Y)))',
)

# ---------------------------------------------------------------------------------------------
# partial sums, shares and reductions over ranks
# ---------------------------------------------------------------------------------------------
_rule(
    "partial-whole-range",
    "partial",
    "the contribution of all reduced indices is the value",
    "(rule ((psum X x 0 K K)) ((union X x)))",
)
_rule("share-whole", "partial", "X * p / p is X", "(rule ((frac X x p p)) ((union X x)))")
_rule("division-is-share", "partial", "X / n is a 1/n share of X", '(rule ((= x (ScI "div" X n))) ((frac X x 1 n)))')
_rule(
    "share-of-share",
    "partial",
    "(X * p / q) / n is a p / m share with m = q n (the encoder's scintprod facts: computed in egglog, a "
    "value equal to itself divided by n, as a folded constant 0 is, would make ever larger divisors)",
    '(rule ((frac X x p q) (= y (ScI "div" x n)) (scintprod q n m)) ((frac X y p m)))',
)
_rule(
    "partial-unary-linear",
    "partial",
    "negation and casts are linear",
    "(rule ((= Y (Un f X)) (= y (Un f x)) (psum X x s e K) (linear-unary f)) ((psum Y y s e K)))",
)
_rule(
    "partial-scaled",
    "partial",
    "scaling by a constant is linear (the reference's scaling is made if it does not exist: a rank may scale "
    "its partial sum before the all-reduce and undo it after, or divide it by the world size to average)",
    "(rule ((= y (Sc f x c)) (psum X x s e K) (scaling f)) ((psum (Sc f X c) y s e K)))",
)
_rule(
    "partial-int-scaled",
    "partial",
    "scaling by a constant is linear (the reference's scaling is made if it does not exist, as above)",
    "(rule ((= y (ScI f x c)) (psum X x s e K) (scaling f)) ((psum (ScI f X c) y s e K)))",
)
_rule(
    "partial-sum-of-partials",
    "partial",
    "adding contributions of the same fraction of two reductions gives that fraction of the sum",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a b)) (additive f) (psum A a s e K) (psum B b s2 e2 K2) "
    "(= (* s K2) (* s2 K)) (= (* e K2) (* e2 K))) ((psum Y y s e K)))",
)
_rule(
    "regroup-partials-out-of-residual",
    "partial",
    "(X + A) + L = X + (A + L), where a rank adds its partial sums of A and L before one all-reduce (SGLang's "
    "parallel attention and MLP, reduce_results=False)",
    '(rule ((= y (Bin "add" a l)) (psum A a s e K) (psum L l s2 e2 K2) (= Y (Bin "add" XA L)) '
    '(= XA (Bin "add" X A))) ((union Y (Bin "add" X (Bin "add" A L)))))',
)
_rule(
    "regroup-partials-out-of-residual-with-term",
    "partial",
    "(X + A) + (L + b) = (X + (A + L)) + b: as regroup-partials-out-of-residual, with a bias added after the "
    "all-reduce",
    '(rule ((= y (Bin "add" a l)) (psum A a s e K) (psum L l s2 e2 K2) (= Y (Bin "add" XA M)) '
    '(= XA (Bin "add" X A)) (= M (Bin "add" L b))) ((union Y (Bin "add" (Bin "add" X (Bin "add" A L)) b))))',
)
_rule(
    "partial-adjacent",
    "partial",
    "the contributions of adjacent index ranges add up to the contribution of their union "
    "(gradients accumulated over consecutive micro-batches)",
    '(rule ((= y (Bin "add" a b)) (psum X a s e K) (psum X b e f K)) ((psum X y s f K)))',
)
_rule(
    "partial-adjacent-swapped",
    "partial",
    "as partial-adjacent, the later range first",
    '(rule ((= y (Bin "add" a b)) (psum X a e f K) (psum X b s e K)) ((psum X y s f K)))',
)
_rule(
    "partial-plus-share",
    "partial",
    "adding a 1/n share of B to a 1/n fraction of A's contributions is that fraction of A + B",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a b)) (additive f) (psum A a s e K) (frac B b p q) "
    "(= (* (- e s) q) (* K p))) ((psum Y y s e K)))",
)
_rule(
    "share-plus-partial",
    "partial",
    "as partial-plus-share, operands swapped",
    "(rule ((= Y (Bin f B A)) (= y (Bin f b a)) (additive f) (psum A a s e K) (frac B b p q) "
    "(= (* (- e s) q) (* K p))) ((psum Y y s e K)))",
)
_rule(
    "partial-times-replicated",
    "partial",
    "multiplying contributions by a common value is linear",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a B)) (psum A a s e K) (multiplicative f)) ((psum Y y s e K)))",
)
_rule(
    "partial-matmul-replicated",
    "partial",
    "a matrix product is linear in its left operand",
    "(rule ((= Y (Matmul A B)) (= y (Matmul a B)) (psum A a s e K)) ((psum Y y s e K)))",
)
_rule(
    "replicated-matmul-partial",
    "partial",
    "a matrix product is linear in its right operand",
    "(rule ((= Y (Matmul B A)) (= y (Matmul B a)) (psum A a s e K)) ((psum Y y s e K)))",
)
_rule(
    "partial-linear-replicated",
    "partial",
    "a linear map is linear in its input",
    "(rule ((= Y (Linear A W)) (= y (Linear a W)) (psum A a s e K)) ((psum Y y s e K)))",
)
_rule(
    "replicated-times-partial",
    "partial",
    "multiplying contributions by a common value is linear",
    '(rule ((= Y (Bin "mul" B A)) (= y (Bin "mul" B a)) (psum A a s e K)) ((psum Y y s e K)))',
)
_rule(
    "partial-reduced-again",
    "partial",
    "summing or averaging contributions over another dim is linear",
    "(rule ((= Y (Red f X d k)) (= y (Red f x d k)) (psum X x s e K) (additive-reduction f)) ((psum Y y s e K)))",
)
_rule(
    "partial-sliced",
    "partial",
    "slicing contributions is linear (the reference's slice is made if it does not exist: a rank may "
    "split its partial sums before a reduce-scatter)",
    "(rule ((= y (Slice x d a b)) (psum X x s e K)) ((psum (Slice X d a b) y s e K)))",
)
_rule(
    "partial-concatenated",
    "partial",
    "concatenating the contributions of the same indices of two values is that contribution of their "
    "concatenation (a rank stacking its partial sums by destination before a reduce-scatter)",
    "(rule ((= y (Cat a b d)) (psum A a s e K) (psum B b s e K)) ((psum (Cat A B d) y s e K)))",
)
_rule(
    "partial-viewed",
    "partial",
    "reshaping contributions is linear (the reference's view is made if it does not exist, and the value has "
    "the shape of its contribution: a rank may flatten its partial sums into one buffer for a single all-reduce "
    "and view them back after)",
    "(rule ((= y (View x s1)) (psum X x s e K) (vshape x sx)) ((psum (View X s1) y s e K) (vshape X sx)))",
)
_rule(
    "partial-view-sizes",
    "partial",
    "a view of a value has the sizes of a rank's contribution to it (the view partial-viewed makes has none stated)",
    "(rule ((psum V y s e K) (= V (View X s1)) (= n (sz y d))) ((set (sz V d) n)))",
)
_rule(
    "partial-view-dims",
    "partial",
    "a view of a value has the number of dims of a rank's contribution to it",
    "(rule ((psum V y s e K) (= V (View X s1)) (= n (nd y))) ((set (nd V) n)))",
)
_rule(
    "partial-permuted",
    "partial",
    "permuting contributions is linear (the reference's permutation is made if it does not exist: a rank may "
    "put the reduce-scattered dim first, as Megatron's sequence parallelism transposes batch-first partial sums)",
    "(rule ((= y (Permute x p)) (psum X x s e K)) ((psum (Permute X p) y s e K)))",
)
_rule(
    "share-scaled",
    "partial",
    "a share of X times a common value is that share of the product",
    "(rule ((= Y (Bin f A B)) (= y (Bin f a B)) (frac A a p q) (multiplicative f)) ((frac Y y p q)))",
)
_rule(
    "reduction-cover-start",
    "partial",
    "collect contributions tiling [0, e) that feed an all-reduce",
    "(rule ((psum Z p 0 e K) (arin p)) ((cover Z (multiset-of p) e K)))",
)
_rule(
    "reduction-cover-extend",
    "partial",
    "extend a tiling by the next contiguous contribution",
    "(rule ((cover Z ms e K) (psum Z p e f K) (arin p)) ((cover Z (multiset-insert ms p) f K)))",
)
_rule(
    "all-reduce-of-tiling",
    "partial",
    "summing contributions that tile [0, K) gives the value",
    "(rule ((cover Z ms K K) (= S (SumN ms))) ((union Z S)))",
)

# The contributions may be terms of a longer sum: a rank adds its row-parallel partial sum (a shared
# expert's output, scaled by a replicated gate) to its own experts' outputs, and one all-reduce adds
# everything (sum_forms.py writes the all-reduce as the sum of all the ranks' terms). Where a sum's
# terms hold contributions tiling [0, K) of one value, they are that value: the sum is the value
# plus the other terms. Only terms of a sum the programs wrote are collected, one occurrence each.
_rule(
    "term-cover-in-sum-start",
    "partial",
    "a sum's term that is the contribution [0, e) of Z starts collecting Z out of the sum",
    "(rule ((= S (SumN ms)) (psum Z p 0 e K) (multiset-contains ms p)) ((subcover S Z (multiset-remove ms p) e K)))",
)
_rule(
    "term-cover-in-sum-extend",
    "partial",
    "the next contribution [e, f) of Z among the sum's remaining terms extends the collection",
    "(rule ((subcover S Z rest e K) (psum Z p e f K) (multiset-contains rest p)) "
    "((subcover S Z (multiset-remove rest p) f K)))",
)
_rule(
    "sum-of-term-cover",
    "partial",
    "a sum whose terms hold contributions tiling [0, K) of Z is Z plus its other terms",
    "(rule ((subcover S Z rest K K)) ((union S (SumN (multiset-insert rest Z)))))",
)

# A rank may add a term to its partial sum that the reference adds to the whole value once (vLLM's
# row-parallel bias on rank 0 only, a residual folded into one rank's partial sum): the ranks'
# contributions still add up to the reference value when they tile the reduction and exactly one
# of them carries the term. The reference's `A + b` and the rank's `a + b` share b's e-class (b is
# the same value on the rank), so each orientation of the two adds is one rule.
for _name, _rank_add, _reference_add in (
    ("partial-plus-term", '(Bin "add" a b)', '(Bin "add" A b)'),
    ("term-plus-partial", '(Bin "add" b a)', '(Bin "add" A b)'),
    ("partial-plus-term-swapped", '(Bin "add" a b)', '(Bin "add" b A)'),
    ("term-plus-partial-swapped", '(Bin "add" b a)', '(Bin "add" b A)'),
):
    _rule(
        _name,
        "partial",
        "a rank's contribution to A plus a term b is that contribution of A + b, with the term once",
        f"(rule ((= y {_rank_add}) (psum A a s e K) (= Y {_reference_add})) ((pplus Y A y s e K)))",
    )
# The reference may add the term to a sum that already holds another: `x + (A + bias)` where the
# rank folds x into its partial sum of A and adds the bias after the all-reduce (a residual on
# one rank before a row-parallel layer's bias). Associativity and commutativity give `(A + x) +
# bias`, whose inner sum the rules above relate; the regrouping is stated only where a rank holds
# a partial sum of A, so it creates a term only where one can be used, and only at sums a program
# computes (`node`): with sums commuting, regrouping the terms it creates again would build every
# grouping of a long residual chain (minutes of saturation on an 8-layer program).
_rule(
    "regroup-term-into-right-sum",
    "partial",
    "x + (A + c) = (A + x) + c, where a rank holds a partial sum of A",
    '(rule ((= Y (Bin "add" X (Bin "add" A C))) (node Y v) (psum A a s e K)) '
    '((union Y (Bin "add" (Bin "add" A X) C))))',
)
_rule(
    "regroup-term-into-left-sum",
    "partial",
    "(A + c) + x = (A + x) + c, where a rank holds a partial sum of A",
    '(rule ((= Y (Bin "add" (Bin "add" A C) X)) (node Y v) (psum A a s e K)) '
    '((union Y (Bin "add" (Bin "add" A X) C))))',
)
_rule(
    "term-cover-start-plain",
    "partial",
    "start a tiling of A + b's all-reduce inputs with a contribution to A that carries no term",
    "(rule ((pplus Y A q s2 e2 K) (psum A p 0 e K) (arin p)) ((coverb Y A (multiset-of p) e K 0)))",
)
_rule(
    "term-cover-start",
    "partial",
    "start a tiling of A + b's all-reduce inputs with the contribution that carries the term",
    "(rule ((pplus Y A p 0 e K) (arin p)) ((coverb Y A (multiset-of p) e K 1)))",
)
_rule(
    "term-cover-extend-plain",
    "partial",
    "extend a tiling by the next contribution to A (no term)",
    "(rule ((coverb Y A ms e K n) (psum A p e f K) (arin p)) ((coverb Y A (multiset-insert ms p) f K n)))",
)
_rule(
    "term-cover-extend",
    "partial",
    "extend a tiling that has no term yet by the next contribution carrying it",
    "(rule ((coverb Y A ms e K 0) (pplus Y A p e f K) (arin p)) ((coverb Y A (multiset-insert ms p) f K 1)))",
)
_rule(
    "all-reduce-of-tiling-with-term",
    "partial",
    "summing contributions that tile [0, K) of A, exactly one carrying the term b, gives A + b",
    "(rule ((coverb Y A ms K K 1) (= S (SumN ms))) ((union Y S)))",
)

# ---------------------------------------------------------------------------------------------
# vocabulary-parallel losses: the max over the classes, the target's logit
# ---------------------------------------------------------------------------------------------
_rule(
    "max-of-selection-is-partial",
    "loss",
    "the max over one range of the reduced dim is a partial max",
    '(rule ((= Y (Red "amax" X d k)) (= y (Red "amax" x d k)) (sel X x d (RCons s e (RNil))) (= K (sz X d))) '
    "((pmax Y y s e K)))",
)
_rule(
    "partial-max-viewed",
    "loss",
    "reshaping partial maxes keeps them partial maxes (a max is taken element by element, and a view moves "
    "elements, not values): a rank may reduce without keeping the dim and view it back in before its MAX "
    "all-reduce, where the reference keeps it, or the other way round",
    "(rule ((= y (View x s1)) (pmax X x s e K) (vshape x sx)) ((pmax (View X s1) y s e K) (vshape X sx)))",
)
_rule(
    "partial-max-view-sizes",
    "loss",
    "a view of a value has the sizes of a rank's partial max of it (the view partial-max-viewed makes has none stated)",
    "(rule ((pmax V y s e K) (= V (View X s1)) (= n (sz y d))) ((set (sz V d) n)))",
)
_rule(
    "partial-max-view-dims",
    "loss",
    "a view of a value has the number of dims of a rank's partial max of it",
    "(rule ((pmax V y s e K) (= V (View X s1)) (= n (nd y))) ((set (nd V) n)))",
)
_rule(
    "max-cover-start",
    "loss",
    "collect partial maxes tiling [0, e) that feed an all-reduce",
    "(rule ((pmax Z p 0 e K) (arin p)) ((maxcover Z (multiset-of p) e K)))",
)
_rule(
    "max-cover-extend",
    "loss",
    "extend a tiling of partial maxes by the next contiguous one",
    "(rule ((maxcover Z ms e K) (pmax Z p e f K) (arin p)) ((maxcover Z (multiset-insert ms p) f K)))",
)
_rule(
    "all-reduce-max-of-tiling",
    "loss",
    "the max of partial maxes that tile [0, K) is the max",
    "(rule ((maxcover Z ms K K) (= M (MaxN ms))) ((union Z M)))",
)
_rule(
    "target-pick-is-partial",
    "loss",
    "picking the local ids of targets in [s, e) from classes [s, e), zero elsewhere, is their contribution",
    "(rule ((sel Z z d (RCons s e (RNil))) (outside m I s e) (localids l I s e) (= q (Pick z l d)) "
    '(= y (Fill q m "0.0")) (= Y (Pick Z I d)) (= K (sz Z d))) ((psum Y y s e K)))',
)
_rule(
    "local-ids-of-squeezed",
    "loss",
    "local ids are computed elementwise: squeezing the local ids of unsqueezed targets gives the local ids of "
    "the targets",
    "(rule ((localids l I s e) (= l2 (View l sh)) (vsqueeze l2 d) (= I (View I0 sh0)) (vunit I d sI) "
    "(vshape I0 sI)) "
    "((localids l2 I0 s e)))",
)
_rule(
    "target-pick-is-partial-unsqueezed",
    "loss",
    "as target-pick-is-partial, with the picks unsqueezed and zeroed by the mask of the unsqueezed targets "
    "(DTensor's masked partial): the contribution to the unsqueezed picks",
    "(rule ((sel Z z d2 (RCons s e (RNil))) (localids l I s e) (= q (Pick z l d2)) (= qv (View q sh)) "
    "(vunit qv d sq) (vshape q sq) (= Iv (View I shI)) (vunit Iv d sI) (vshape I sI) (outside mv Iv s e) "
    '(= y (Fill qv mv "0.0")) (= Y (Pick Z I d2)) (= YV (View Y sh)) (= K (sz Z d2))) ((psum YV y s e K)))',
)
_rule(
    "target-whole-range-pick",
    "loss",
    "local ids of the whole class range [0, K) are the targets themselves (targets are class indices)",
    "(rule ((localids l I 0 K) (= y (Pick Z l d)) (= K (sz Z d))) ((union y (Pick Z I d))))",
)
_rule(
    "target-whole-range-mask",
    "loss",
    "no target lies outside the whole class range [0, K): zeroing the picks of outside targets changes nothing",
    '(rule ((outside m I 0 K) (= Y (Pick Z I d)) (= K (sz Z d)) (= y (Fill Y m "0.0"))) ((union y Y)))',
)
