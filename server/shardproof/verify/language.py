"""The egglog vocabulary: tensor terms, range lists, shapes and the relations between programs.

Terms (sort `T`) name values of every program at once: the reference and all ranks share one
e-graph, so a rank value that provably equals a reference value ends up in the same e-class
("replicated"), and congruence carries that equality forward for free. Dims are negative.

Relations (Datalog facts, all existence-guarded by the rules that derive them):

  (sel X x d R)          x == X[..., R, ...]: the ranges R of dim d, concatenated in order
                          (a shard is a one-range selection; fused weights have several ranges)
  (selw X x d lo hi n)   x == X.narrow(d, s, n) for every s in [lo, hi] (replicated KV heads)
  (psum X x s e K)       x is the contribution of reduced indices [s, e) of K to X: summing such
                          contributions over a tiling of [0, K) gives X (row-parallel partial sums)
  (frac X x p q)         x == X * p / q (a rank's share of a replicated bias)
  (pplus Y A y s e K)    Y == A + b and y == (the contribution of [s, e) of K to A) + b: a rank that
                          adds a term b to its partial sum of A, where the reference adds b to A
                          (a row-parallel bias added on one rank only, a residual folded into one
                          rank's partial sum)
  (coverb Y A ms e K n)  the sum of the multiset ms is the contribution of [0, e) of K to A plus n
                          copies of Y - A: all-reduce inputs tiling [0, e), n of them carrying the term
  (subcover S Z rest e K) S is the sum of the multiset rest plus the contribution of [0, e) of K to
                          Z: a sum's terms holding Z's contributions, collected out of it
  (psumi X x R K)         x is the contribution of the indices the range list R names (several ranges:
                          every k-th row of a round-robin shard) to X (index_sets.py)
  (pmax X x s e K)       x is the max over reduced indices [s, e) of K of what X is the max of:
                          the max of such contributions over a tiling of [0, K) is X
  (outside m ids s e)    m == (ids < s) | (ids >= e)           (vocab-parallel masks)
  (inside m ids s e)     m == (ids >= s) & (ids < e)
  (localids l ids s e)   l == where(m, 0, ids - s) for such an m
  (embpart y0 Y m s e)   y0 == embedding of the ids in [s, e) of Y, garbage where m is set
  (arin x)               x feeds an all-reduce (sum, max or min)
  (a2a-piece x)          x is a block an all-to-all or all-gather moves (a slice of a rank's value)

Facts about a permutation p (its text, as `(Permute x p)` writes it), stated by the encoder:
(pmap p i o) output dim o is input dim i; (ptail p k) p leaves its last k dims in place;
(pcompose p q r) x.permute(p).permute(q) == x.permute(r); (pinverse p q) it is x itself.

`(Along f X d a)` is op f (with literal arguments a) applied to every 1-d fiber of X along d on
its own, e.g. topk or cumsum along d.

`(Pick X I d)` is X.gather(d, I.unsqueeze(d)).squeeze(d): row by row, the entry I names along d
(a target's logit).

Range lists `Rg` are built from RNil/RCons; RApp, RShift, RSub, RClip, RDiv, RMul, RCompose, RTile and
RUnion are
evaluated by the `ranges` ruleset. A rule whose conclusion needs a computed list states it as a
pending selection `(selp X x d R)`; it becomes `(sel X x d R)` only once R evaluated to a plain
list. A list operation whose precondition fails (a range not aligned to a head, a range outside
a slice) never evaluates, so it never yields a fact and never feeds another rule.
"""

from __future__ import annotations

DECLARATIONS = r"""
(datatype* (T
    (Param String)
    (Input String)
    (Const String)
    (Leaf String)
    (Slice T i64 i64 i64)
    (Cat T T i64)
    (View T String)
    (Permute T String)
    (Expand T String)
    (Rep T i64 i64)
    (Un String T)
    (Sc String T String)
    (ScI String T i64)
    (Bin String T T)
    (Where T T T)
    (Fill T T String)
    (Red String T i64 i64)
    (Softmax T i64)
    (Along String T i64 String)
    (LogSoftmax T i64)
    (Linear T T)
    (Matmul T T)
    (Emb T T)
    (Pick T T i64)
    (Sdpa T T T String)
    (SdpaMask T T T T String)
    (SumN TSet)
    (MaxN TSet)
    (MinN TSet)
    (Op0 String String)
    (Op1 String T String)
    (Op2 String T T String)
    (Op3 String T T T String)
    (Op4 String T T T T String))
  (sort TSet (MultiSet T)))

(datatype Rg
    (RNil)
    (RCons i64 i64 Rg)
    (RApp Rg Rg)
    (RShift Rg i64)
    (RSub Rg i64 i64)
    (RClip Rg i64 i64)
    (RDiv Rg i64)
    (RMul Rg i64)
    (RCompose Rg Rg)
    (RTile Rg i64 i64)
    (RUnion Rg Rg))

(function sz (T i64) i64 :no-merge)
(function nd (T) i64 :no-merge)

(relation sel (T T i64 Rg))
(relation selp (T T i64 Rg))
(relation evaluated (Rg))
(relation selw (T T i64 i64 i64 i64))
(relation psum (T T i64 i64 i64))
(relation psumi (T T Rg i64))
(relation coveri (T TSet Rg i64))
(relation coverip (T TSet Rg i64))
(relation ascending (Rg))
(relation tiled (Rg i64 i64 i64 i64))
(relation pmax (T T i64 i64 i64))
(relation frac (T T i64 i64))
(relation arin (T))
(relation a2a-piece (T))
(relation cover (T TSet i64 i64))
(relation subcover (T T TSet i64 i64))
(relation pplus (T T T i64 i64 i64))
(relation coverb (T T TSet i64 i64 i64))
(relation maxcover (T TSet i64 i64))
(relation outside (T T i64 i64))
(relation inside (T T i64 i64))
(relation localids (T T i64 i64))
(relation embpart (T T T i64 i64))

(relation vkeep (T i64 i64 String String))
(relation vsplit (T i64 i64 i64 String String))
(relation vmerge (T i64 i64 i64 String String))
(relation vunit (T i64 String))
(relation vsqueeze (T i64))
(relation vshape (T String))
(relation pmap (String i64 i64))
(relation ptail (String i64))
(relation pcompose (String String String))
(relation pinverse (String String))
(relation emap (T i64 String))
(relation ebk (T i64 String))
(relation ebsrc (T i64))

(relation node (T String))
"""

# Relations whose rows the verifier reads back after saturation.
RESULT_RELATIONS = ("sel", "selw", "psum", "pmax", "frac", "node")


def quoted(text: str) -> str:
    """`text` as an egglog string literal."""
    import json

    return json.dumps(text)
