"""The declaration in pyproject.toml: parsed once, errors at the offending line."""

from pathlib import Path

import pytest

from shardproof.config import parse_project
from shardproof.errors import ConfigError

GOOD = """
[tool.shardproof]
python-path = ["src"]

[[tool.shardproof.check]]
name = "llama-tp"
reference = "m.model:build"
parallel = "m.tp:parallelize"
inputs = "m.model:inputs"
world-sizes = [2, 4]
outputs = "replicated"

[tool.shardproof.check.parameters]
"layers.*.wq_local" = "shard:0 of layers.*.attention.wq.weight"
"norm.weight" = "replicated"

[tool.shardproof.check.bounds]
iterations = 50
"""


def parse(text: str):
    return parse_project(text, Path("/proj/pyproject.toml"))


def test_good_declaration_is_read() -> None:
    project = parse(GOOD)
    (check,) = project.checks
    assert check.name == "llama-tp"
    assert check.world_sizes == (2, 4)
    assert check.outputs == "replicated"
    assert check.bounds.iterations == 50
    assert project.python_path == (Path("/proj/src"),)
    assert check.relation_override("layers.3.wq_local") == ("shard:0", "layers.3.attention.wq.weight", 14)
    assert check.relation_override("norm.weight") == ("replicated", "norm.weight", 15)
    assert check.relation_override("other") is None


def test_underscore_spelling_is_accepted() -> None:
    project = parse(GOOD.replace("world-sizes", "world_sizes"))
    assert project.checks[0].world_sizes == (2, 4)


@pytest.mark.parametrize(
    ("change", "message", "line"),
    [
        (('parallel = "m.tp:parallelize"', 'parallel = "m.tp"'), "`parallel` must be", 8),
        (("world-sizes = [2, 4]", "world-sizes = [0]"), "world-sizes", 10),
        (('outputs = "replicated"', 'outputs = "all"'), "`outputs` must be", 11),
        (('"norm.weight" = "replicated"', '"norm.weight" = "mirrored"'), "relation for 'norm.weight'", 15),
        (("iterations = 50", 'iterations = "many"'), "bounds must be numbers", 17),
    ],
)
def test_bad_values_are_reported_at_their_line(change, message, line) -> None:
    text = GOOD.replace(*change)
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert message in info.value.message
    assert info.value.site is not None
    assert info.value.site.file == "/proj/pyproject.toml"
    assert info.value.site.line == line


def test_missing_section() -> None:
    with pytest.raises(ConfigError, match=r"no \[tool.shardproof\] section"):
        parse("[project]\nname = 'x'\n")


def test_invalid_toml_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse("[tool.shardproof]\n[[tool.shardproof.check]]\nname = \n")
    assert info.value.site is not None and info.value.site.line == 3


def test_duplicate_check_names() -> None:
    twice = GOOD + GOOD.split('[tool.shardproof]\npython-path = ["src"]\n')[1].split("[tool.shardproof.check.para")[0]
    with pytest.raises(ConfigError, match="declared twice"):
        parse(twice)


def test_unknown_check_name_lists_the_declared_ones() -> None:
    project = parse(GOOD)
    with pytest.raises(ConfigError, match="declared: llama-tp"):
        project.check("nope")


SAME_CODE = (
    GOOD.replace('reference = "m.model:build"', "reference = { world-size = 1 }")
    + """
[tool.shardproof.check.quick]
parallel = "m.tp:parallelize_small"
world-sizes = [2]
"""
)


def test_the_same_code_at_world_size_1_can_be_the_reference() -> None:
    (check,) = parse(SAME_CODE).checks
    assert check.same_code_reference
    assert check.reference == check.parallel == "m.tp:parallelize"
    quick = check.for_mode("quick")
    assert quick.same_code_reference
    assert quick.reference == quick.parallel == "m.tp:parallelize_small"


@pytest.mark.parametrize("table", ["{ world-size = 2 }", "{ world-size = 1, builder = 'x' }", "{ }"])
def test_a_reference_table_other_than_world_size_1_is_refused_at_its_line(table: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(SAME_CODE.replace("{ world-size = 1 }", table))
    assert "world-size = 1" in info.value.message
    assert info.value.site is not None and info.value.site.line == 7


def test_a_same_code_check_cannot_set_a_quick_reference() -> None:
    text = SAME_CODE.replace('parallel = "m.tp:parallelize_small"', 'reference = "m.model:small"')
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert "quick `reference`" in info.value.message


def test_a_packed_weight_declares_its_parts() -> None:
    project = parse(GOOD.replace('"norm.weight" = "replicated"', '"mlp.fc1.weight" = "packed-shard:0:2"'))
    assert project.checks[0].relation_override("mlp.fc1.weight") == ("packed-shard:0:2", "mlp.fc1.weight", 15)


@pytest.mark.parametrize("relation", ["packed-shard:0", "packed-shard:0:0", "packed:0:2"])
def test_a_malformed_packed_relation_names_the_forms(relation: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(GOOD.replace('"norm.weight" = "replicated"', f'"mlp.fc1.weight" = "{relation}"'))
    assert "packed-shard:<dim>:<parts>" in info.value.message
    assert info.value.site is not None and info.value.site.line == 15


def test_a_packed_shard_holds_the_rank_block_of_every_part() -> None:
    from shardproof.config import declared_blocks

    # [gate; up], 8 rows each, 4 ranks: rank 1 holds gate rows 2:4 and up rows 10:12
    assert declared_blocks("packed-shard:0:2", 16, 1, 4) == [(2, 4), (10, 12)]
    assert declared_blocks("shard:0", 16, 1, 4) == [(4, 8)]


def test_a_pipeline_declares_that_only_the_last_rank_returns_the_output() -> None:
    project = parse(GOOD.replace('outputs = "replicated"', 'outputs = "last-rank"'))
    assert project.check("llama-tp").outputs == "last-rank"


def test_an_unclosed_bracket_is_reported_where_it_opens() -> None:
    text = '[tool.shardproof]\npython-path = ["src"\n\n[[tool.shardproof.check]]\nname = "x"\n'
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert info.value.site is not None and info.value.site.line == 2
    assert "the bracket opened on line 2 is not closed" in info.value.message


@pytest.mark.parametrize(
    ("change", "message", "line"),
    [
        (
            ("outputs = ", "worldsize = 3\noutputs = "),
            "check 'llama-tp': unknown key `worldsize`; did you mean `world-sizes`?",
            11,
        ),
        (
            ("iterations = 50", "iteration = 50"),
            "check 'llama-tp' bounds: unknown key `iteration`; did you mean `iterations`?",
            18,
        ),
        (
            ('python-path = ["src"]', 'pythonpath = ["src"]'),
            "[tool.shardproof]: unknown key `pythonpath`; did you mean `python-path`?",
            3,
        ),
    ],
)
def test_an_unknown_key_is_reported_at_its_line_with_the_closest_known_key(change, message, line) -> None:
    with pytest.raises(ConfigError) as info:
        parse(GOOD.replace(*change))
    assert info.value.message == message
    assert info.value.site is not None and info.value.site.line == line
