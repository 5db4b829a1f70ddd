"""The relational rules on hand-written programs (no torch): proofs, and refusals to prove."""

from shardproof.verify.engine import saturate

MLP = """
(let $x (Input "x"))
(let $w1 (Param "w1")) (set (sz $w1 -2) 8) (set (sz $w1 -1) 4) (set (nd $w1) 2)
(let $w2 (Param "w2")) (set (sz $w2 -2) 4) (set (sz $w2 -1) 8) (set (nd $w2) 2)
(set (sz $x -2) 3) (set (sz $x -1) 4) (set (nd $x) 2)
(let $ref (Linear (Un "gelu" (Linear $x $w1)) $w2))
(set (sz (Linear $x $w1) -1) 8) (set (sz (Linear $x $w1) -2) 3) (set (nd (Linear $x $w1)) 2)
(set (sz (Un "gelu" (Linear $x $w1)) -1) 8) (set (sz (Un "gelu" (Linear $x $w1)) -2) 3)
(set (nd (Un "gelu" (Linear $x $w1))) 2)
(node $ref "reference/out")
"""


def _rank(r: int, w1_rows: tuple[int, int], w2_cols: tuple[int, int]) -> str:
    a, b = w1_rows
    c, d = w2_cols
    return f"""
(let $a{r} (Slice $w1 -2 {a} {b}))
(let $b{r} (Slice $w2 -1 {c} {d}))
(let $h{r} (Linear $x $a{r}))
(set (sz $h{r} -1) {b - a}) (set (sz $h{r} -2) 3) (set (nd $h{r}) 2)
(let $g{r} (Un "gelu" $h{r}))
(set (sz $g{r} -1) {b - a}) (set (sz $g{r} -2) 3) (set (nd $g{r}) 2)
(let $p{r} (Linear $g{r} $b{r}))
(arin $p{r})
"""


def _program(shards: list[tuple[tuple[int, int], tuple[int, int]]]) -> list[str]:
    text = MLP + "".join(_rank(r, *s) for r, s in enumerate(shards))
    members = " ".join(f"$p{r}" for r in range(len(shards)))
    text += f'(let $out (SumN (multiset-of {members})))\n(node $out "rank0/out")\n'
    return [line for line in text.splitlines() if line.strip()]


def _proven(commands: list[str]) -> bool:
    result = saturate(commands, 50, 30, 100_000)
    assert result.status == "fixpoint"
    assert result.facts is not None
    classes = result.facts.classes
    return classes["reference/out"] == classes["rank0/out"]


def test_column_then_row_parallel_mlp_is_proven() -> None:
    assert _proven(_program([((0, 4), (0, 4)), ((4, 8), (4, 8))]))


def test_four_ranks_in_any_order_are_proven() -> None:
    assert _proven(_program([((4, 6), (4, 6)), ((0, 2), (0, 2)), ((6, 8), (6, 8)), ((2, 4), (2, 4))]))


def test_mismatched_shards_are_not_proven() -> None:
    assert not _proven(_program([((0, 4), (4, 8)), ((4, 8), (0, 4))]))


def test_every_rank_on_the_first_shard_is_not_proven() -> None:
    assert not _proven(_program([((0, 4), (0, 4)), ((0, 4), (0, 4))]))


def test_off_by_one_shard_is_not_proven() -> None:
    assert not _proven(_program([((0, 3), (0, 3)), ((3, 8), (4, 8))]))


def test_a_prepared_egraph_proves_what_a_fresh_one_does() -> None:
    from shardproof.verify.engine import Saturation, prepared_egraph

    def partition(result: Saturation) -> set[frozenset[str]]:
        classes: dict[int, set[str]] = {}
        assert result.facts is not None
        for name, cls in result.facts.classes.items():
            classes.setdefault(cls, set()).add(name)
        return {frozenset(names) for names in classes.values()}

    for shards in ([((0, 4), (0, 4)), ((4, 8), (4, 8))], [((0, 4), (0, 4)), ((0, 4), (4, 8))]):
        commands = _program(shards)
        fresh = saturate(commands, 50, 30, 100_000)
        prepared = saturate(commands, 50, 30, 100_000, prepared_egraph())
        assert (prepared.status, prepared.rows) == (fresh.status, fresh.rows)
        assert partition(prepared) == partition(fresh)
