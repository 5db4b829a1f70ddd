"""The one declaration of what to verify: `[tool.shardproof]` in the user's pyproject.toml.

```toml
[tool.shardproof]
python-path = ["."]                            # optional; import roots relative to this file

[[tool.shardproof.check]]
name = "llama-tp"
reference = "mymodel.model:build"              # () -> nn.Module, the sequential model
parallel = "mymodel.tp:parallelize"            # (reference_module, rank, world_size) -> nn.Module
inputs = "mymodel.model:example_inputs"        # () -> tuple of example inputs
world-sizes = [2, 4, 8]
outputs = "replicated"                         # optional: replicated | sharded | partial | last-rank (default sharded)

[tool.shardproof.check.parameters]            # optional overrides, by rank parameter name pattern
"layers.*.rotary.inv_freq" = "replicated"      # replicated | shard:<dim> | share (1/world_size of it)
"layers.*.wq_local" = "shard:0 of layers.*.attention.wq.weight"   # when the names differ
"layers.*.fc1.weight" = "packed-shard:0:2"     # [gate; up] packed along dim 0, each part sharded

[tool.shardproof.check.gradients]             # optional: verify parameter gradients too
reference-step = "mymodel.train:reference_step"  # optional (model, *inputs) -> outputs; runs backward
parallel-step = "mymodel.train:parallel_step"    # itself and finishes the gradients (DP averaging)

[tool.shardproof.check.bounds]                # optional saturation bounds
iterations = 200
seconds = 120
memory-mb = 8192

[tool.shardproof.check.quick]                 # optional: what the editor verifies on every edit
reference = "mymodel.model:build_small"        # e.g. fewer layers, smaller dimensions
inputs = "mymodel.model:small_inputs"
world-sizes = [2]

[[tool.shardproof.check]]                      # one parallel model, world size 1 as the reference
name = "fairscale-llama"                       # (the fairscale / Megatron habit)
parallel = "mymodel.parallel:build"            # () -> nn.Module, reads the rank from torch.distributed
reference = { world-size = 1 }                 # the same builder under a one-rank process group
inputs = "mymodel.model:example_inputs"
world-sizes = [2, 4]
```

With a world-size-1 reference, a rank parameter relates to the reference parameter of the same
name by shape: the same shape is replicated, one dim world-size times smaller is the rank's
contiguous block of it (how fairscale and Megatron initialise and reshard). `parameters`
declarations override that, e.g. for an interleaved layout.

`gradients = true` (or the table above) compares every trainable reference parameter's gradient
with its rank counterpart's: the full gradient for a replicated parameter, the same block for a
sharded one. Without steps, the outputs are differentiated with a cotangent that is an input like
any other (the same on every rank), so `outputs` must be `replicated`; a step runs forward and
backward itself (micro-batches, gradient averaging, accumulation) and gradients are read from
`.grad` afterwards.

Keys may be spelled with dashes or underscores. The CLI and the language server both read checks
through `load_project`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .graph.model import Frame

OUTPUT_EXPECTATIONS = ("replicated", "sharded", "partial", "last-rank")
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_RELATION = re.compile(
    r"^(?P<relation>replicated|share|shard:-?\d+|packed-shard:-?\d+:[1-9]\d*)(?:\s+of\s+(?P<reference>\S+))?$"
)


@dataclass(frozen=True)
class Bounds:
    iterations: int = 400
    seconds: float = 300.0
    memory_mb: int = 8192
    max_rows: int = 3_000_000


@dataclass(frozen=True)
class Check:
    name: str
    reference: str
    parallel: str
    inputs: str
    world_sizes: tuple[int, ...]
    outputs: str = "sharded"
    parameters: tuple[ParameterOverride, ...] = ()
    bounds: Bounds = field(default_factory=Bounds)
    line: int = 0  # line of the check's table in pyproject.toml
    key_lines: tuple[tuple[str, int], ...] = ()  # key -> line, for errors about one key
    quick: Check | None = None  # the reduced configuration the editor verifies on every edit
    # `reference = { world-size = 1 }`: the reference is the parallel builder itself, built and
    # traced under a one-rank process group (then `reference` repeats the `parallel` spec).
    reference_world_size: int | None = None
    gradients: Gradients | None = None  # verify parameter gradients too (joint forward-backward capture)

    @property
    def same_code_reference(self) -> bool:
        return self.reference_world_size is not None

    def for_mode(self, mode: str) -> Check:
        """`quick` (the editor's inline checks, when declared) or `full`."""
        return self.quick if mode == "quick" and self.quick is not None else self

    def relation_override(self, parameter: str) -> tuple[str, str, int] | None:
        """(relation, reference parameter name, declaration line) for a rank parameter, if declared."""
        for override in self.parameters:
            match = re.fullmatch(_glob_regex(override.pattern), parameter)
            if match is None:
                continue
            reference = override.reference or parameter
            for group in match.groups():
                reference = reference.replace("*", group, 1)
            return override.relation, reference, override.line
        return None

    def line_of(self, key: str) -> int:
        return dict(self.key_lines).get(key, self.line)


@dataclass(frozen=True)
class Gradients:
    """How gradients are made: by default the outputs are differentiated with a cotangent input;
    a step `(model, *inputs) -> outputs` runs backward itself and finishes the gradients."""

    reference_step: str | None = None
    parallel_step: str | None = None


def _glob_regex(pattern: str) -> str:
    """A glob as a regex whose groups capture what each `*` matched."""
    return "".join("(.*)" if ch == "*" else "(.)" if ch == "?" else re.escape(ch) for ch in pattern)


@dataclass(frozen=True)
class ParameterOverride:
    pattern: str
    relation: str  # replicated | share | shard:<dim> | packed-shard:<dim>:<parts>
    reference: str | None  # reference parameter name (may use the pattern's *), default: the same name
    line: int


def declared_shard(size: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of a rank's block under a declared `shard:<dim>`: the rank-th of world_size equal
    blocks (what the static capture assumes and the numeric witness loads)."""
    per_rank = size // world_size
    return rank * per_rank, (rank + 1) * per_rank


def same_code_sharded_dim(shape: tuple[int, ...], reference_shape: tuple[int, ...], world_size: int) -> int | None:
    """For the same code at world size 1: the one dim along which a rank tensor is world_size times
    smaller than the reference tensor of the same name (fairscale's and Megatron's contiguous
    block), or None when the shapes relate otherwise (equal shapes are checked by the caller)."""
    if len(shape) != len(reference_shape):
        return None
    differing = [d for d, (ours, theirs) in enumerate(zip(shape, reference_shape, strict=True)) if ours != theirs]
    if len(differing) != 1 or reference_shape[differing[0]] != shape[differing[0]] * world_size:
        return None
    return differing[0]


def declared_blocks(relation: str, size: int, rank: int, world_size: int) -> list[tuple[int, int]]:
    """The [start, end) ranges of the declared dim that a rank holds, concatenated in order:
    one block for `shard:<dim>`; for `packed-shard:<dim>:<parts>` (a weight that packs `parts`
    equal matrices along the dim, such as Megatron's [gate; up]) the rank's block of every part."""
    parts = int(relation.split(":")[2]) if relation.startswith("packed-shard:") else 1
    part = size // parts
    blocks = []
    for index in range(parts):
        start, end = declared_shard(part, rank, world_size)
        blocks.append((index * part + start, index * part + end))
    return blocks


def declared_dim(relation: str) -> int:
    """The dim of a `shard:<dim>` or `packed-shard:<dim>:<parts>` relation."""
    return int(relation.split(":")[1])


@dataclass(frozen=True)
class Project:
    root: Path
    pyproject: Path
    python_path: tuple[Path, ...]
    checks: tuple[Check, ...]

    def check(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        names = ", ".join(c.name for c in self.checks) or "none"
        raise ConfigError(f"no check named {name!r} (declared: {names})", self.site(1))

    def site(self, line: int) -> Frame:
        return Frame(str(self.pyproject), line, "[tool.shardproof]")


# The keys each table of the declaration knows (dashes; underscores are accepted too).
SECTION_KEYS = ("python-path", "check")
CHECK_KEYS = (
    "name",
    "reference",
    "parallel",
    "inputs",
    "world-sizes",
    "outputs",
    "parameters",
    "bounds",
    "gradients",
    "quick",
)
BOUNDS_KEYS = ("iterations", "seconds", "memory-mb", "max-rows")
QUICK_KEYS = ("reference", "parallel", "inputs", "world-sizes")


def _reject_unknown(
    table: dict[str, Any], known: tuple[str, ...], where: str, line_of: Callable[[str], int], site: Any
) -> None:
    """A key the table does not know is a mistake (`worldsize = 3` would otherwise be ignored
    silently): reported at its line, with the closest known key."""
    for key in table:
        if key.replace("_", "-") in known:
            continue
        close = difflib.get_close_matches(key.replace("_", "-").lower(), known, n=1, cutoff=0.5)
        hint = f"; did you mean `{close[0]}`?" if close else f" (known: {', '.join(known)})"
        raise ConfigError(f"{where}: unknown key `{key}`{hint}", site(line_of(key)))


def _key(table: dict[str, Any], name: str) -> Any:
    for spelling in (name, name.replace("_", "-"), name.replace("-", "_")):
        if spelling in table:
            return table[spelling]
    return None


def _line_of(lines: list[str], needle: str, start: int = 0) -> int:
    for index in range(start, len(lines)):
        if needle in lines[index]:
            return index + 1
    return start + 1 if start < len(lines) else 1


def find_pyproject(start: Path) -> Path | None:
    start = start.resolve()
    for directory in [start, *start.parents] if start.is_dir() else [start.parent, *start.parent.parents]:
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_project(path: Path) -> Project:
    """Read the checks of the project at `path` (a directory or a pyproject.toml)."""
    pyproject = path if path.name == "pyproject.toml" else find_pyproject(path)
    if pyproject is None or not pyproject.is_file():
        raise ConfigError(f"no pyproject.toml found at or above {path}")
    text = pyproject.read_text(encoding="utf-8")
    return parse_project(text, pyproject)


def parse_project(text: str, pyproject: Path) -> Project:
    lines = text.splitlines()

    def site(line: int) -> Frame:
        return Frame(
            str(pyproject), line, "[tool.shardproof]", lines[line - 1].strip() if 0 < line <= len(lines) else ""
        )

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = int(match[1]) if match else 1
        opened = unclosed_bracket_line(lines, line)
        message = f"pyproject.toml is not valid TOML: {exc}"
        if opened is not None and opened != line:
            message += f"; the bracket opened on line {opened} is not closed"
        raise ConfigError(message, site(opened or line)) from None
    tool = data.get("tool", {}).get("shardproof")
    if tool is None:
        raise ConfigError("pyproject.toml has no [tool.shardproof] section", site(1))
    section_line = _line_of(lines, "tool.shardproof")
    _reject_unknown(
        tool,
        SECTION_KEYS,
        "[tool.shardproof]",
        lambda key: _line_of(lines, key.replace("_", "-"), section_line - 1),
        site,
    )
    root = pyproject.parent
    python_path_raw = _key(tool, "python_path") or ["."]
    if not isinstance(python_path_raw, list) or not all(isinstance(p, str) for p in python_path_raw):
        raise ConfigError("python-path must be a list of directories", site(_line_of(lines, "python")))
    python_path = tuple((root / p).resolve() for p in python_path_raw)
    raw_checks = _key(tool, "check")
    if not isinstance(raw_checks, list) or not raw_checks:
        raise ConfigError("declare at least one [[tool.shardproof.check]]", site(section_line))
    checks: list[Check] = []
    search_from = 0
    seen: set[str] = set()
    for raw in raw_checks:
        line = _line_of(lines, "[[tool.shardproof.check]]", search_from)
        search_from = line
        checks.append(_parse_check(raw, line, lines, site, seen))
    return Project(root=root, pyproject=pyproject, python_path=python_path, checks=tuple(checks))


def _reference_world_size(value: Any, name: str, where: Frame) -> int | None:
    """`reference = { world-size = 1 }` declares the parallel code at world size 1 as the reference."""
    if not isinstance(value, dict):
        return None
    world_size = _key(value, "world_size")
    unknown = sorted(set(value) - {"world-size", "world_size"})
    if unknown or world_size != 1 or isinstance(world_size, bool):
        raise ConfigError(
            f"check {name!r}: a table `reference` declares the parallel code at world size 1 as the reference and "
            f"must be exactly {{ world-size = 1 }}, got {value!r}",
            where,
        )
    return 1


def _gradients(value: Any, name: str, outputs: str, line: int, lines: list[str], site: Any) -> Gradients | None:
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"check {name!r}: `gradients` must be true or a table with `reference-step` / `parallel-step`",
            site(line),
        )
    unknown = sorted(set(value) - {"reference-step", "reference_step", "parallel-step", "parallel_step"})
    if unknown:
        raise ConfigError(
            f"check {name!r}: unknown key(s) in `gradients`: {', '.join(unknown)} (reference-step, parallel-step)",
            site(line),
        )
    steps: dict[str, str | None] = {}
    for key in ("reference_step", "parallel_step"):
        spec = _key(value, key)
        if spec is not None and (not isinstance(spec, str) or not _SPEC.match(spec)):
            raise ConfigError(
                f'check {name!r}: gradients `{key.replace("_", "-")}` must be "package.module:function", got {spec!r}',
                site(_line_of(lines, key.replace("_", "-"), line - 1)),
            )
        steps[key] = spec
    if outputs == "last-rank":
        raise ConfigError(f"check {name!r}: gradients cannot be verified for pipeline stages (last-rank)", site(line))
    if outputs != "replicated" and not (steps["reference_step"] and steps["parallel_step"]):
        raise ConfigError(
            f"check {name!r}: gradients without steps differentiate the outputs with the same cotangent on every "
            'rank, so `outputs` must be "replicated" (or declare reference-step and parallel-step)',
            site(line),
        )
    return Gradients(steps["reference_step"], steps["parallel_step"])


def _parse_check(raw: Any, line: int, lines: list[str], site: Any, seen: set[str]) -> Check:
    if not isinstance(raw, dict):
        raise ConfigError("each [[tool.shardproof.check]] must be a table", site(line))

    def key_line(key: str) -> int:
        for spelling in (key, key.replace("_", "-")):
            found = _line_of(lines, spelling, line - 1)
            if found != line or spelling in lines[line - 1]:
                return found
        return line

    name = _key(raw, "name")
    if not isinstance(name, str) or not name:
        raise ConfigError("a check needs a non-empty `name`", site(line))
    _reject_unknown(raw, CHECK_KEYS, f"check {name!r}", key_line, site)
    if name in seen:
        raise ConfigError(f"check name {name!r} is declared twice", site(key_line("name")))
    seen.add(name)
    specs: dict[str, str] = {}
    reference_world_size = _reference_world_size(_key(raw, "reference"), name, site(key_line("reference")))
    for key in ("reference", "parallel", "inputs"):
        value = _key(raw, key)
        if key == "reference" and reference_world_size is not None:
            continue
        if value is None:
            raise ConfigError(f'check {name!r} has no `{key}` ("package.module:function")', site(line))
        if not isinstance(value, str) or not _SPEC.match(value):
            raise ConfigError(
                f'check {name!r}: `{key}` must be "package.module:function", got {value!r}', site(key_line(key))
            )
        specs[key] = value
    world_sizes = _key(raw, "world_sizes")
    if (
        not isinstance(world_sizes, list)
        or not world_sizes
        or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in world_sizes)
    ):
        raise ConfigError(
            f"check {name!r}: `world-sizes` must be a list of positive integers", site(key_line("world_sizes"))
        )
    outputs = _key(raw, "outputs") or "sharded"
    if outputs not in OUTPUT_EXPECTATIONS:
        raise ConfigError(
            f"check {name!r}: `outputs` must be one of {', '.join(OUTPUT_EXPECTATIONS)}", site(key_line("outputs"))
        )
    parameters_raw = _key(raw, "parameters") or {}
    if not isinstance(parameters_raw, dict):
        raise ConfigError(
            f"check {name!r}: `parameters` must be a table of pattern = relation", site(key_line("parameters"))
        )
    parameters: list[ParameterOverride] = []
    for pattern, value in parameters_raw.items():
        reference = None
        if isinstance(value, dict):
            reference = value.get("reference")
            value = value.get("relation")
        match = _RELATION.match(value) if isinstance(value, str) else None
        if match is None or (reference is not None and not isinstance(reference, str)):
            raise ConfigError(
                f"check {name!r}: relation for {pattern!r} must be replicated, share, shard:<dim> or "
                "packed-shard:<dim>:<parts> "
                f"(optionally followed by `of <reference parameter>`), got {value!r}",
                site(key_line(pattern)),
            )
        parameters.append(
            ParameterOverride(pattern, match["relation"], reference or match["reference"], key_line(pattern))
        )
    bounds_raw = _key(raw, "bounds") or {}
    if not isinstance(bounds_raw, dict):
        raise ConfigError(f"check {name!r}: `bounds` must be a table", site(key_line("bounds")))
    _reject_unknown(bounds_raw, BOUNDS_KEYS, f"check {name!r} bounds", key_line, site)
    defaults = Bounds()
    try:
        bounds = Bounds(
            iterations=int(_key(bounds_raw, "iterations") or defaults.iterations),
            seconds=float(_key(bounds_raw, "seconds") or defaults.seconds),
            memory_mb=int(_key(bounds_raw, "memory_mb") or defaults.memory_mb),
            max_rows=int(_key(bounds_raw, "max_rows") or defaults.max_rows),
        )
    except (TypeError, ValueError):
        raise ConfigError(f"check {name!r}: bounds must be numbers", site(key_line("bounds"))) from None
    gradients = _gradients(_key(raw, "gradients"), name, outputs, key_line("gradients"), lines, site)
    key_lines = tuple((key, key_line(key)) for key in ("reference", "parallel", "inputs", "world_sizes", "outputs"))
    check = Check(
        key_lines=key_lines,
        name=name,
        reference=specs["parallel"] if reference_world_size is not None else specs["reference"],
        reference_world_size=reference_world_size,
        parallel=specs["parallel"],
        inputs=specs["inputs"],
        world_sizes=tuple(world_sizes),
        outputs=outputs,
        parameters=tuple(parameters),
        bounds=bounds,
        line=line,
        gradients=gradients,
    )
    quick_raw = _key(raw, "quick")
    if quick_raw is None:
        return check
    if not isinstance(quick_raw, dict):
        raise ConfigError(f"check {name!r}: `quick` must be a table", site(key_line("quick")))
    quick_line = _line_of(lines, "tool.shardproof.check.quick", line - 1)

    def quick_key_line(key: str) -> int:
        for spelling in (key, key.replace("_", "-")):
            found = _line_of(lines, spelling, quick_line)
            if found > quick_line and spelling in lines[found - 1]:
                return found
        return quick_line

    _reject_unknown(quick_raw, QUICK_KEYS, f"check {name!r} quick", quick_key_line, site)
    changes: dict[str, Any] = {}
    for key in ("reference", "parallel", "inputs"):
        value = _key(quick_raw, key)
        if value is None:
            continue
        if key == "reference" and check.same_code_reference:
            raise ConfigError(
                f"check {name!r}: quick `reference` cannot be set when the reference is the parallel code at world "
                "size 1 (set quick `parallel` instead)",
                site(quick_key_line(key)),
            )
        if not isinstance(value, str) or not _SPEC.match(value):
            raise ConfigError(
                f'check {name!r}: quick `{key}` must be "package.module:function", got {value!r}',
                site(quick_key_line(key)),
            )
        changes[key] = value
    quick_sizes = _key(quick_raw, "world_sizes")
    if quick_sizes is not None:
        if (
            not isinstance(quick_sizes, list)
            or not quick_sizes
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in quick_sizes)
        ):
            raise ConfigError(
                f"check {name!r}: quick `world-sizes` must be a list of positive integers",
                site(quick_key_line("world_sizes")),
            )
        changes["world_sizes"] = tuple(quick_sizes)
    if check.same_code_reference and "parallel" in changes:
        changes["reference"] = changes["parallel"]
    quick_key_lines = tuple((key, quick_key_line(key)) for key in changes)
    return dataclasses.replace(
        check, quick=dataclasses.replace(check, **changes, key_lines=check.key_lines + quick_key_lines)
    )


def unclosed_bracket_line(lines: list[str], upto: int) -> int | None:
    """The line of the innermost `[` or `{` of a value still open at line `upto` (1-based): tomllib
    notices an unclosed array only where the next key begins, lines after the mistake."""
    stack: list[int] = []
    quote: str | None = None
    for number, text in enumerate(lines[:upto], start=1):
        i = 0
        while i < len(text):
            char = text[i]
            if quote is not None:
                if text.startswith(quote, i):
                    i += len(quote)
                    quote = None
                    continue
                if char == "\\" and quote == '"':
                    i += 2
                    continue
            elif char == "#":
                break
            elif text.startswith(('"""', "'''"), i):
                quote = text[i : i + 3]
                i += 3
                continue
            elif char in "\"'":
                quote = char
            elif char in "[{":
                stack.append(number)
            elif char in "]}" and stack:
                stack.pop()
            i += 1
        if quote is not None and len(quote) == 1:
            quote = None  # a one-line string ends with its line
    return stack[-1] if stack else None
