"""Which block instances the recorder lets one template stand for (capture/blocks.py)."""

from __future__ import annotations

import torch
from torch import nn

from shardproof.capture import blocks

OUTSIDE = torch.ones(8, device="meta")


class Block(nn.Module):
    def __init__(self, index: int, mode: str = "plain") -> None:
        super().__init__()
        self.index, self.mode = index, mode
        self.proj = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "branch" and self.index == 2:
            return x  # one layer skips its work
        if self.mode == "write-input":
            x.view(-1).add_(1.0)  # a write through a view of the input
        if self.mode == "outside":
            return self.proj(x) * OUTSIDE  # a tensor that is neither an input nor the block's
        return x + self.proj(x)


def record(mode: str) -> list[blocks.BlockInstance]:
    with torch.device("meta"):
        model = nn.Sequential(*(Block(i, mode) for i in range(4)))
    return blocks.record(model, (torch.zeros(2, 8, device="meta"),))


def test_identical_layers_share_the_first_as_their_template() -> None:
    instances = record("plain")
    assert [i.path for i in instances] == ["0", "1", "2", "3"]
    assert all(i.memoizable and i.template == "0" for i in instances)


def test_a_layer_whose_code_path_differs_gets_its_own_template() -> None:
    templates = {i.path: i.template for i in record("branch")}
    assert templates == {"0": "0", "1": "0", "2": "2", "3": "0"}


def test_a_write_into_a_view_of_the_input_is_not_memoized() -> None:
    assert not any(i.memoizable for i in record("write-input"))


def test_a_tensor_from_outside_the_block_is_not_memoized() -> None:
    assert not any(i.memoizable for i in record("outside"))


class ReducingBlock(nn.Module):
    """Reduces its projection over a process group with a reduction, both chosen per layer."""

    def __init__(self, op: object = None, group: object = None) -> None:
        super().__init__()
        self.op, self.group = op, group
        self.proj = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        y = self.proj(x)
        dist.all_reduce(y, op=self.op or dist.ReduceOp.SUM, group=self.group)
        return x + y


def test_layers_reducing_with_another_operation_or_group_get_their_own_template() -> None:
    import torch.distributed as dist

    from shardproof.capture.fake_pg import fake_rank

    with fake_rank(0, 4):
        pair = dist.new_group([0, 1])
        with torch.device("meta"):
            model = nn.Sequential(
                ReducingBlock(),
                ReducingBlock(),
                ReducingBlock(op=dist.ReduceOp.MAX),  # a MAX among sums
                ReducingBlock(group=pair),  # a sum over two ranks among sums over four
            )
        instances = blocks.record(model, (torch.zeros(2, 8, device="meta"),))
    assert {i.path: i.template for i in instances} == {"0": "0", "1": "0", "2": "2", "3": "3"}
    assert all(i.memoizable for i in instances)


def test_an_argument_the_record_cannot_describe_is_not_memoized() -> None:
    class Takes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8, bias=False)

        def forward(self, x: torch.Tensor, scale: object) -> torch.Tensor:
            return self.proj(x) * scale.value  # type: ignore[attr-defined]

    class Scale:
        def __init__(self, value: float) -> None:
            self.value = value

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Takes() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(self.layers):
                x = layer(x, Scale(float(i)))  # the layers' own objects differ in what they hold
            return x

    with torch.device("meta"):
        model = Model()
    instances = blocks.record(model, (torch.zeros(2, 8, device="meta"),))
    assert not any(i.memoizable for i in instances)


class Sharded(nn.Module):
    """The same operations on a weight of the size its rank holds (uneven shards: 3, 3, 2 rows)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.up = nn.Parameter(torch.empty(rows, 8, device="meta"))
        self.down = nn.Parameter(torch.empty(8, rows, device="meta"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(x @ self.up.t()) @ self.down.t()


def test_blocks_holding_weights_of_other_sizes_are_other_records() -> None:
    # with no size among the operations' arguments, only the weights' shapes tell them apart: a
    # template traced with three rows must not stand for a block holding two
    model = nn.Sequential(Sharded(3), Sharded(3), Sharded(2))
    instances = blocks.record(model, (torch.zeros(2, 8, device="meta"),))
    assert [i.template for i in instances] == ["0", "0", "2"]


def test_the_program_outside_its_blocks_has_a_record_of_its_own() -> None:
    def skeleton(scale: float) -> str | None:
        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layers = nn.ModuleList([Sharded(3), Sharded(3)])

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                for layer in self.layers:
                    x = layer(x)
                return x * scale

        return blocks.record_program(Model(), (torch.zeros(2, 8, device="meta"),)).skeleton

    assert skeleton(2.0) is not None
    assert skeleton(2.0) == skeleton(2.0)
    assert skeleton(2.0) != skeleton(3.0)  # a number outside the blocks is part of the record


def test_a_block_not_memoized_leaves_the_skeleton_without_a_record() -> None:
    # its operations are the skeleton's, recorded as the block's: the record cannot vouch for them
    with torch.device("meta"):
        model = nn.Sequential(*(Block(i, "outside") for i in range(3)))
    assert blocks.record_program(model, (torch.zeros(2, 8, device="meta"),)).skeleton is None


class ShardEmbedding(nn.Embedding):
    """An embedding of the ids from `offset` on (a vocabulary shard)."""

    def __init__(self, offset: int) -> None:
        super().__init__(16, 8)
        self.offset = offset

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids - self.offset)


class Embedded(nn.Module):
    """Layers between an embedding and an output layer, which may share the embedding's weight."""

    def __init__(self, offset: int = 0, tied: bool = False, norm_twice: bool = False) -> None:
        super().__init__()
        self.norm_twice = norm_twice
        self.embed = ShardEmbedding(offset)
        self.layers = nn.ModuleList([Sharded(3), Sharded(3)])
        self.norm = nn.LayerNorm(8)
        self.act = nn.ReLU()  # holds no tensor: stays in the skeleton
        self.out = nn.Linear(8, 16, bias=False)
        if tied:
            self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        if self.norm_twice:
            x = self.norm(x)
        return self.out(self.act(x))


def _program(**options: object) -> blocks.ProgramRecord:
    with torch.device("meta"):
        model = Embedded(**options)  # type: ignore[arg-type]
    return blocks.record_program(model, (torch.zeros(2, 4, dtype=torch.long, device="meta"),))


def test_the_modules_beside_the_blocks_are_recorded_apart() -> None:
    recorded = _program()
    lone = {i.path: i for i in recorded.instances if i.lone}
    assert sorted(lone) == ["embed", "norm", "out"]
    assert all(i.memoizable and i.template == i.path for i in lone.values())
    assert [i.path for i in recorded.instances if not i.lone] == ["layers.0", "layers.1"]


def test_programs_that_differ_only_inside_a_lone_module_have_one_skeleton_record() -> None:
    # a rank-dependent number inside the embedding (a vocabulary shard's offset) is the embedding's
    # record, not the skeleton's: the ranks trace one skeleton and each its own embedding
    first, second = _program(offset=0), _program(offset=8)
    assert first.skeleton is not None and first.skeleton == second.skeleton
    embed = [next(i for i in p.instances if i.path == "embed") for p in (first, second)]
    assert embed[0].digest != embed[1].digest

    # what the module gives the skeleton is the skeleton's record: results of another shape differ
    class Cut(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.width = width
            self.scale = nn.Parameter(torch.ones(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.scale)[..., : self.width]

    class Model(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList([Sharded(3), Sharded(3)])
            self.cut = Cut(width)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            for layer in self.layers:
                x = layer(x)
            return x, self.cut(x)

    with torch.device("meta"):
        records = [blocks.record_program(Model(w), (torch.zeros(2, 8),)) for w in (4, 6)]
    assert all(r.skeleton is not None for r in records) and records[0].skeleton != records[1].skeleton


def test_a_lone_module_sharing_a_weight_or_called_twice_stays_in_the_skeleton() -> None:
    tied = _program(tied=True)
    assert sorted(i.path for i in tied.instances if i.lone) == ["norm"]  # tied weights: neither is apart
    twice = _program(norm_twice=True)
    norm = next(i for i in twice.instances if i.path == "norm")
    assert not norm.memoizable and twice.skeleton is None  # its second call was the skeleton's
