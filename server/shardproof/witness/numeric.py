"""Run the reference and every rank of the parallel version with real numbers, in this process.

Each rank runs in its own thread on torch's threaded process group (real collectives between the
threads), in float64, on random weights and the example inputs. The outputs are compared with the
reference's under the check's declared output relation, and optionally at one module (the one
holding a localized discrepancy), through forward hooks.

Checks whose reference is the same code at world size 1 run each rank in its own process instead
(`rank_processes.py`): their libraries keep model-parallel state in process globals.

This is the numeric counterpart of the static proof: a discrepancy whose numbers differ is
*confirmed*; the suite also cross-checks that what is proven equal is numerically equal.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten

from ..config import declared_blocks, declared_dim

# A check's declared parameter relations: rank parameter name -> (relation, reference name, line).
RelationOverride = Callable[[str], "tuple[str, str, int] | None"]

# Relative error (to the largest reference magnitude) above which values count as different. The
# run is in float64 on small weights: equal programs agree to ~1e-14, real bugs differ by O(1).
RELATIVE_TOLERANCE = 1e-6
# Larger models are not run with real numbers (memory and time); a quick configuration is used.
MAX_PARAMETER_ELEMENTS = 64_000_000
WEIGHT_SCALE = 0.3
RUN_TIMEOUT_SECONDS = 120.0


@dataclass
class Difference:
    where: str  # "output 0", or a module path
    max_abs: float
    max_rel: float
    note: str = ""

    @property
    def differs(self) -> bool:
        return not (self.max_rel <= RELATIVE_TOLERANCE)  # NaN differs


@dataclass
class NumericComparison:
    world_size: int
    configuration: str  # "full" or "quick"
    outputs: list[Difference] = field(default_factory=list)
    at_module: Difference | None = None
    inputs: str = "the example inputs"
    seconds: float = 0.0

    @property
    def differs(self) -> bool:
        return any(d.differs for d in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: an error that is not a number (different shapes, missing values) is null."""

        def finite(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: finite(v) for k, v in value.items()}
            if isinstance(value, list):
                return [finite(v) for v in value]
            return value

        return finite(asdict(self))


class NumericRunError(Exception):
    """The program could not be run with real numbers; the message says why."""


def to_float64(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64) if value.is_floating_point() else value
    if isinstance(value, list | tuple):
        return type(value)(to_float64(v) for v in value)
    if isinstance(value, dict):
        return {k: to_float64(v) for k, v in value.items()}
    return value


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def _threaded_world() -> Iterator[Any]:
    """torch's in-process process group: one thread per rank, collectives exchange real data.
    (A torch testing utility: the only place shardproof touches it.)"""
    from torch.testing._internal.distributed import multi_threaded_pg

    if dist.is_initialized():
        dist.destroy_process_group()
    # A run whose rank failed set the class-wide termination flag (`_wake_other_ranks`): left set,
    # every collective of a later run returns at once and its ranks end without outputs.
    multi_threaded_pg.ProcessLocalGroup.reset()
    # Process groups registered per thread, as torch's own threaded tests do.
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    world = multi_threaded_pg._install_threaded_pg()
    try:
        yield dist.HashStore()
    finally:
        multi_threaded_pg._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        del world


@contextlib.contextmanager
def _point_to_point(world_size: int) -> Iterator[None]:
    """send / recv between the rank threads (the threaded process group has none on CPU): one
    mailbox per (source, destination), delivered in order."""
    import queue

    from ..capture.remap import point_to_point

    boxes = {(a, b): queue.Queue() for a in range(world_size) for b in range(world_size)}

    def send(tensor: torch.Tensor, peer: int) -> None:
        boxes[(dist.get_rank(), peer)].put(tensor.detach().clone())

    def recv(tensor: torch.Tensor, peer: int) -> None:
        tensor.copy_(boxes[(peer, dist.get_rank())].get(timeout=RUN_TIMEOUT_SECONDS))

    with point_to_point(send, recv, sends_first=True):
        yield


def _wake_other_ranks(error: BaseException) -> None:
    """A failing rank would leave the others waiting in a collective: end theirs too."""
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    with contextlib.suppress(Exception):
        ProcessLocalGroup.exception_handle(error)


def randomize(module: nn.Module, seed: int) -> None:
    """Random weights for every floating parameter (computed buffers such as rotary tables keep
    their values): equivalence must hold for all weights, and ones or zeros hide mistakes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, param in module.named_parameters():
            if param.is_floating_point():
                param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * WEIGHT_SCALE)


def parameter_elements(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _first_tensor(value: Any) -> torch.Tensor | None:
    leaves, _ = tree_flatten(value)
    return next((leaf for leaf in leaves if isinstance(leaf, torch.Tensor)), None)


def difference(where: str, reference: torch.Tensor, candidate: torch.Tensor, note: str = "") -> Difference:
    if reference.shape != candidate.shape:
        return Difference(where, math.inf, math.inf, f"shape {list(candidate.shape)}, expected {list(reference.shape)}")
    reference = reference.to(torch.float64)
    error = (candidate.to(torch.float64) - reference).abs().max().item() if reference.numel() else 0.0
    scale = reference.abs().max().item() if reference.numel() else 0.0
    return Difference(where, error, error / max(scale, 1e-12), note)


def _combine(reference: torch.Tensor, per_rank: list[torch.Tensor], relation: str) -> tuple[torch.Tensor, str]:
    """What the ranks hold together, under the declared output relation."""
    if relation == "partial":
        return torch.stack([t.to(torch.float64) for t in per_rank]).sum(0), "sum over ranks"
    if relation == "sharded" and any(t.shape != reference.shape for t in per_rank):
        for dim in range(reference.dim()):
            try:
                joined = torch.cat(per_rank, dim=dim)
            except RuntimeError:
                continue
            if joined.shape == reference.shape:
                return joined, f"concatenated along dim {dim}"
        return per_rank[0], "rank 0 (no dim along which the shards form the reference's shape)"
    return per_rank[0], "every rank"  # replicated (or a sharded output that every rank holds in full)


def _compare(where: str, reference: torch.Tensor, per_rank: list[torch.Tensor], relation: str) -> Difference:
    combined, how = _combine(reference, per_rank, relation)
    if how == "every rank":
        worst = max((difference(where, reference, t) for t in per_rank), key=lambda d: (d.max_rel, d.max_abs))
        worst.note = worst.note or "every rank holds it in full"
        return worst
    return difference(where, reference, combined, how)


def input_trials(
    reference: nn.Module, inputs: tuple[Any, ...], world_size: int, seed: int
) -> Iterator[tuple[str, Any]]:
    """The example inputs, then inputs that reach the places a shard boundary hides: token ids at
    every vocabulary shard boundary, and random values."""
    yield "the example inputs", inputs
    # nn.Embedding and the libraries' vocabulary-parallel embeddings (at world size 1, the whole vocabulary)
    sizes = (getattr(m, "num_embeddings", None) for m in reference.modules())
    vocab = max((size for size in sizes if isinstance(size, int)), default=0)
    generator = torch.Generator().manual_seed(seed + 1)

    def boundary_ids(tensor: torch.Tensor) -> torch.Tensor:
        edges = {0, vocab - 1}
        for k in range(1, world_size):
            edge = k * vocab // world_size
            edges.update({edge - 1, edge})
        values = torch.tensor(sorted(e for e in edges if 0 <= e < vocab), dtype=tensor.dtype)
        flat = torch.randint(0, vocab, (tensor.numel(),), generator=generator, dtype=tensor.dtype)
        flat[: min(len(values), flat.numel())] = values[: flat.numel()]
        return flat.reshape(tensor.shape)

    def random_like(tensor: Any, ids: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        if isinstance(tensor, torch.Tensor):
            if tensor.is_floating_point():
                return torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
            if vocab and tensor.dtype in (torch.int64, torch.int32) and tensor.numel() and tensor.max() < vocab:
                return ids(tensor)
            return tensor
        if isinstance(tensor, list | tuple):
            return type(tensor)(random_like(t, ids) for t in tensor)
        return tensor

    if vocab:
        yield "token ids at every vocabulary shard boundary", random_like(inputs, boundary_ids)
    for trial in range(2):
        yield (
            f"random inputs (draw {trial + 1})",
            random_like(inputs, lambda t: torch.randint(0, vocab, t.shape, generator=generator, dtype=t.dtype)),
        )


def refuse_large(build: Callable[[], Any], limit: int) -> None:
    """Count the parameters without allocating them (meta, or fake tensors for builders that
    ignore the meta device); refuse a model too large to run with real numbers. A builder that
    fails both ways is left to the real build, which reports its error."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    probe = None
    for mode in (lambda: torch.device("meta"), lambda: FakeTensorMode(allow_non_fake_inputs=True)):
        try:
            with mode():
                probe = build()
            break
        except Exception:  # noqa: BLE001 - try the next way; the real build reports errors
            continue
    elements = parameter_elements(probe) if isinstance(probe, nn.Module) else 0
    if elements > limit:
        raise NumericRunError(
            f"the model has {elements:,} parameter elements, too many to run with real numbers; "
            "declare a smaller quick configuration"
        )


def run_and_compare(
    build_reference: Callable[[], Any],
    make_inputs: Callable[[], Any],
    build_parallel: Callable[..., Any],
    world_size: int,
    output_relation: str,
    module_path: str = "",
    configuration: str = "full",
    seed: int = 0,
    relation_override: RelationOverride | None = None,
) -> NumericComparison:
    """Reference vs all ranks on real numbers, on the example inputs and then on inputs chosen to
    expose boundary mistakes, stopping at the first that differs. Raises NumericRunError when the
    program cannot be run with real numbers."""
    start = time.perf_counter()
    # User code warns about deprecated collectives etc.; the static capture reported those already.
    with default_dtype(torch.float64), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference, inputs = random_reference(build_reference, make_inputs, seed)
        trials = (
            (
                description,
                _one_trial(
                    reference,
                    candidate,
                    build_parallel,
                    world_size,
                    output_relation,
                    module_path,
                    configuration,
                    relation_override or (lambda _name: None),
                ),
            )
            for description, candidate in input_trials(reference, to_float64(inputs), world_size, seed)
        )
        best = first_differing(trials)
    best.seconds = time.perf_counter() - start
    return best


def random_reference(
    build_reference: Callable[[], Any], make_inputs: Callable[[], Any], seed: int
) -> tuple[nn.Module, tuple[Any, ...]]:
    """The reference in float64 eval mode on random weights, and the example inputs as a tuple
    (call under `default_dtype(torch.float64)`)."""
    try:
        refuse_large(build_reference, MAX_PARAMETER_ELEMENTS)
        torch.manual_seed(seed)
        reference = build_reference()
        inputs = make_inputs()
    except NumericRunError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported as the reason no witness exists
        raise NumericRunError(f"building the reference on real tensors failed: {exc}") from None
    if not isinstance(inputs, tuple):
        inputs = tuple(inputs) if isinstance(inputs, list) else (inputs,)
    reference.to(torch.float64).eval()
    randomize(reference, seed)
    return reference, inputs


def first_differing(trials: Iterable[tuple[str, NumericComparison]]) -> NumericComparison:
    """The first trial whose numbers differ (later trials are not run), else the first trial;
    each labelled with the inputs it ran on."""
    best: NumericComparison | None = None
    for description, comparison in trials:
        comparison.inputs = description
        if best is None or comparison.differs:
            best = comparison
        if comparison.differs:
            break
    if best is None:
        raise NumericRunError("the ranks ran no input")
    return best


def _one_trial(
    reference: nn.Module,
    inputs: tuple[Any, ...],
    build_parallel: Callable[..., Any],
    world_size: int,
    output_relation: str,
    module_path: str,
    configuration: str,
    relation_override: RelationOverride,
) -> NumericComparison:
    captured: dict[str, Any] = {}
    hook = hook_module(reference, module_path, captured, "reference")
    reference_outputs, _ = tree_flatten(reference(*inputs))
    if hook is not None:
        hook.remove()
    copies = [copy.deepcopy(reference) for _ in range(world_size)]

    def forward(module: nn.Module, rank: int) -> list[Any]:
        with torch.no_grad():
            hook = hook_module(module, module_path, captured, f"rank{rank}")
            flat, _ = tree_flatten(module(*inputs))
            if hook is not None:
                hook.remove()
        return flat

    rank_outputs = run_ranks(copies, build_parallel, world_size, relation_override, forward)
    return compare_runs(
        reference_outputs, rank_outputs, captured, world_size, output_relation, module_path, configuration
    )


def compare_runs(
    reference_outputs: list[Any],
    rank_outputs: list[list[Any]],
    captured: dict[str, Any],
    world_size: int,
    output_relation: str,
    module_path: str,
    configuration: str,
) -> NumericComparison:
    """The errors of every rank's flattened outputs against the reference's under the declared
    output relation, and at `module_path` from the values `captured` under "reference" and
    "rank<r>" (the first call of that module)."""
    result = NumericComparison(world_size, configuration)
    if output_relation == "last-rank":  # a pipeline: the last stage returns the outputs
        rank_outputs, output_relation = rank_outputs[-1:], "replicated"
    for index, expected in enumerate(reference_outputs):
        if not isinstance(expected, torch.Tensor):
            continue
        per_rank = [outputs[index] if index < len(outputs) else None for outputs in rank_outputs]
        if any(not isinstance(t, torch.Tensor) for t in per_rank):
            result.outputs.append(Difference(f"output {index}", math.inf, math.inf, "a rank returns no such output"))
            continue
        result.outputs.append(_compare(f"output {index}", expected, per_rank, output_relation))
    if module_path and "reference" in captured:
        per_rank = [captured.get(f"rank{r}") for r in range(world_size)]
        if all(isinstance(t, torch.Tensor) for t in per_rank):
            result.at_module = _compare(module_path, captured["reference"], per_rank, "replicated")
            if math.isinf(result.at_module.max_abs):
                result.at_module.note += " (each rank holds a shard here)"
        else:
            result.at_module = Difference(module_path, math.nan, math.nan, "the ranks have no module of that name")
    return result


def hook_module(module: nn.Module, path: str, into: dict[str, Any], key: str) -> Any:
    if not path:
        return None
    try:
        target = module.get_submodule(path)
    except AttributeError:
        return None

    def record(_module: nn.Module, _args: Any, output: Any) -> None:
        tensor = _first_tensor(output)
        if tensor is not None and key not in into:  # the first call: shared modules run again later
            into[key] = tensor.detach().clone()

    return target.register_forward_hook(record)


def load_declared_values(
    module: nn.Module,
    reference: nn.Module,
    relation_override: RelationOverride,
    rank: int,
    world_size: int,
    undeclared: Callable[[torch.Tensor | None, torch.Tensor], torch.Tensor | None] | None = None,
) -> None:
    """Give the rank parameters and buffers with a declared relation the values it states. The
    static proof assumes the declaration (it stands for loading the builder cannot show, such as a
    checkpoint read at run time), so the numbers must run under the same assumption. `undeclared`
    gives the value of the others from (the reference tensor of the same name or None, the rank
    tensor), or None to keep what the builder made."""
    reference_tensors = dict(reference.named_parameters(remove_duplicate=False))
    reference_tensors |= dict(reference.named_buffers(remove_duplicate=False))
    rank_tensors = list(module.named_parameters(remove_duplicate=False))
    rank_tensors += list(module.named_buffers(remove_duplicate=False))
    for name, tensor in rank_tensors:
        declared = relation_override(name)
        if declared is None:
            value = undeclared(reference_tensors.get(name), tensor) if undeclared is not None else None
        else:
            relation, reference_name, _line = declared
            source = reference_tensors.get(reference_name)
            if source is None:
                raise NumericRunError(
                    f"the declaration for {name!r} names {reference_name!r}, which the reference lacks"
                )
            value = declared_value(source, relation, rank, world_size)
        if value is not None:
            tensor.copy_(value)


def declared_value(source: torch.Tensor, relation: str, rank: int, world_size: int) -> torch.Tensor:
    """A rank's value of a reference tensor under a declared relation (replicated, share,
    shard:<d>, packed-shard:<d>:<parts>)."""
    if relation == "share":
        return source / world_size
    if relation.startswith(("shard:", "packed-shard:")):
        dim = declared_dim(relation)
        blocks = declared_blocks(relation, source.shape[dim], rank, world_size)
        return torch.cat([source.narrow(dim, start, end - start) for start, end in blocks], dim=dim)
    return source


def run_ranks(
    copies: list[nn.Module],
    build_parallel: Callable[..., Any],
    world_size: int,
    relation_override: RelationOverride,
    run: Callable[[nn.Module, int], Any],
) -> list[Any]:
    """Build every rank from its copy of the reference and `run(module, rank)` it, each rank on
    its own thread of the threaded process group; what each run returns, by rank."""
    outputs: list[Any] = [[] for _ in range(world_size)]
    failures: list[str] = []
    lock = threading.Lock()

    def one_rank(rank: int, store: Any) -> None:
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            with torch.no_grad():
                module = build_parallel(copies[rank], rank, world_size)
                load_declared_values(module, copies[rank], relation_override, rank, world_size)
            module.eval()
            outputs[rank] = run(module, rank)
        except Exception as exc:  # noqa: BLE001 - reported as the reason no witness exists
            with lock:
                failures.append(f"rank {rank}: {type(exc).__name__}: {exc}")
            _wake_other_ranks(exc)
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    with _threaded_world() as store, _point_to_point(world_size):
        threads = [
            threading.Thread(target=one_rank, args=(rank, store), name=f"shardproof-rank{rank}", daemon=True)
            for rank in range(world_size)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in threads):
            _wake_other_ranks(TimeoutError("shardproof: numeric run timed out"))
            for thread in threads:
                thread.join(5.0)
            raise NumericRunError(
                f"the ranks did not finish within {RUN_TIMEOUT_SECONDS:.0f} s (a collective that not every rank "
                "calls waits forever)"
            )
    if failures:
        raise NumericRunError("running the ranks with real numbers failed: " + "; ".join(failures[:2]))
    return outputs
