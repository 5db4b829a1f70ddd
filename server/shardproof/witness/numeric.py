"""Run the reference and every rank of the parallel version with real numbers, in this process.

Each rank runs in its own thread on torch's threaded process group (real collectives between the
threads), in float64, on random weights. Each seed of weights builds every rank once and runs the
inputs `trials.input_trials` chooses; the outputs are compared with the reference's under the
check's declared output relation, and at one module (the one holding a localized finding)
through forward hooks (`compare.py`). The first seed whose numbers differ ends the run.

A model whose kernels refuse float64 (grouped matmuls accept float32, bfloat16 and float16 only)
runs again in float32, with the float32 tolerance. A rank that raises in its forward pass on
inputs the reference runs is a shown difference (in float32 too, so a dtype is never the cause);
a rank that cannot be built or ranks that never finish are a reason there is no witness.

Checks whose reference is the same code at world size 1 run each rank in its own process instead
(`rank_processes.py`): their libraries keep model-parallel state in process globals.

This is the numeric counterpart of the static proof: a finding whose numbers differ is
*confirmed*; the suite also cross-checks that what is proven equal is numerically equal.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten

from ..capture.dtensor import global_values
from ..capture.fake_pg import keep_excepthook
from ..config import declared_blocks, declared_dim
from .compare import RELATIVE_TOLERANCE, Difference, NumericComparison, compare_runs, difference, tolerance_of
from .threaded_collectives import complete_threaded_collectives
from .trials import SEEDS, input_trials

__all__ = [
    "RELATIVE_TOLERANCE",
    "Difference",
    "NumericComparison",
    "NumericRunError",
    "compare_runs",
    "difference",
    "run_and_compare",
    "run_ranks",
]

# A check's declared parameter relations: rank parameter name -> (relation, reference name, line).
RelationOverride = Callable[[str], "tuple[str, str, int] | None"]

# Larger models are not run with real numbers (memory and time); a quick configuration is used.
MAX_PARAMETER_ELEMENTS = 64_000_000
WEIGHT_SCALE = 0.3
RUN_TIMEOUT_SECONDS = 120.0
# The dtypes a witness runs in, in order: the next when the model cannot run in the previous.
DTYPES = (torch.float64, torch.float32)


class NumericRunError(Exception):
    """The program could not be run with real numbers; the message says why."""


class RankFailure(NumericRunError):
    """A rank raised while running: in its forward pass on `inputs` (which the reference runs),
    or while it was built (`inputs` empty)."""

    def __init__(self, message: str, inputs: str = "") -> None:
        super().__init__(message)
        self.inputs = inputs


class RunTimedOut(NumericRunError):
    """The ranks did not finish in time (no other dtype would change that)."""


def to_dtype(value: Any, dtype: torch.dtype) -> Any:
    """`value` with its floating tensors in `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, list | tuple):
        return type(value)(to_dtype(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: to_dtype(v, dtype) for k, v in value.items()}
    return value


def to_float64(value: Any) -> Any:
    return to_dtype(value, torch.float64)


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
        # (reduce-scatter with MAX, reduce: what the threaded group lacks, emulated exactly)
        with complete_threaded_collectives():
            yield dist.HashStore()
    finally:
        multi_threaded_pg._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        del world


@contextlib.contextmanager
def _shared_loss_parallel() -> Iterator[None]:
    """`loss_parallel()` installs DTensor's loss handlers in a process-wide table on entry and
    removes them on exit; with the ranks as threads of one process, the first rank out removed
    them under the others. Counted instead: installed while any rank is inside the block."""
    from torch.distributed.tensor.parallel import loss

    enable, disable = loss._enable_custom_loss_ops, loss._disable_custom_loss_ops
    inside = [0]
    lock = threading.Lock()

    def counted_enable() -> None:
        with lock:
            inside[0] += 1
            if inside[0] == 1:
                enable()

    def counted_disable() -> None:
        with lock:
            inside[0] -= 1
            if inside[0] == 0:
                disable()

    loss._enable_custom_loss_ops, loss._disable_custom_loss_ops = counted_enable, counted_disable
    try:
        yield
    finally:
        loss._enable_custom_loss_ops, loss._disable_custom_loss_ops = enable, disable


@contextlib.contextmanager
def _point_to_point(world_size: int) -> Iterator[None]:
    """send / recv between the rank threads (the threaded process group has none on CPU): one
    mailbox per (source, destination), delivered in order."""
    import queue

    from ..capture.remap import point_to_point

    boxes = {(a, b): queue.Queue() for a in range(world_size) for b in range(world_size)}

    def send(tensor: torch.Tensor, peer: int, blocking: bool) -> None:
        boxes[(dist.get_rank(), peer)].put(tensor.detach().clone())

    def recv(tensor: torch.Tensor, peer: int, blocking: bool) -> None:
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
    seeds: tuple[int, ...] = SEEDS,
    relation_override: RelationOverride | None = None,
    compared: Iterable[int] = (),
) -> NumericComparison:
    """Reference vs all ranks on real numbers: every seed of random weights on the inputs
    `input_trials` chooses, stopping at the first seed whose numbers differ. Raises
    NumericRunError when the program cannot be run with real numbers."""
    start = time.perf_counter()
    override = relation_override or (lambda _name: None)

    def attempt(dtype: torch.dtype) -> list[NumericComparison]:
        def compare(reference_outputs: list[Any], rank_outputs: list[list[Any]], captured: dict[str, Any]) -> Any:
            tolerance = tolerance_of(dtype)
            return compare_runs(
                reference_outputs,
                rank_outputs,
                captured,
                world_size,
                output_relation,
                module_path,
                configuration,
                tolerance,
            )

        # User code warns about deprecated collectives etc.; the static capture reported those already.
        with default_dtype(dtype), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference, inputs = random_reference(build_reference, make_inputs, seeds[0], dtype)
            comparisons: list[NumericComparison] = []
            for seed in seeds:
                randomize(reference, seed)
                trials = input_trials(reference, to_dtype(inputs, dtype), world_size, seed, compared)
                found = _one_seed(reference, trials, build_parallel, world_size, override, module_path, compare)
                for comparison in found:
                    comparison.seed = seed
                comparisons.extend(found)
                if any(c.differs for c in found):
                    break
            return comparisons

    best = in_dtypes(attempt, world_size, configuration)
    best.seconds = time.perf_counter() - start
    return best


def in_dtypes(
    attempt: Callable[[torch.dtype], list[NumericComparison]], world_size: int, configuration: str
) -> NumericComparison:
    """The witness of `attempt` in the first of DTYPES the model runs in: a model that cannot run
    in float64, or whose rank fails in it, runs again in float32, so that a failing rank is
    shown only when the dtype is not the cause. Raises NumericRunError when no dtype runs it."""
    reasons: list[str] = []
    failed: NumericComparison | None = None
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        try:
            comparisons = attempt(dtype)
        except RunTimedOut:
            raise  # another dtype would wait as long
        except NumericRunError as exc:
            reasons.append(f"in {name}: {exc}")
            continue
        for comparison in comparisons:
            comparison.dtype = name
        result = summarize(comparisons, world_size, configuration)
        if result.failure and failed is not None:
            failed.notes.append(f"it fails in {name} too: {result.failure}")
            return failed  # the first dtype's failure, shown in every dtype
        if result.failure and dtype != DTYPES[-1]:
            reasons.append(f"in {name}: {result.failure}")
            failed = result
            continue
        result.notes = [f"not run {reason}" for reason in reasons] + result.notes
        return result
    messages = list(dict.fromkeys(reason.split(": ", 1)[-1] for reason in reasons))
    raise NumericRunError(messages[0] if len(messages) == 1 else "; ".join(reasons))


def summarize(comparisons: list[NumericComparison], world_size: int, configuration: str) -> NumericComparison:
    """One witness from its trials: the first that differs, else the first (the example inputs of
    the first seed), with every trial recorded."""
    if not comparisons:
        raise NumericRunError("the ranks ran no input")
    best = next((c for c in comparisons if c.differs), comparisons[0])
    best.world_size, best.configuration = world_size, configuration
    best.trials = [c.trial() for c in comparisons]
    return best


def random_reference(
    build_reference: Callable[[], Any], make_inputs: Callable[[], Any], seed: int, dtype: torch.dtype = torch.float64
) -> tuple[nn.Module, tuple[Any, ...]]:
    """The reference in `dtype`, eval mode, on random weights, and the example inputs as a tuple
    (call under `default_dtype(dtype)`)."""
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
    reference.to(dtype).eval()
    randomize(reference, seed)
    return reference, inputs


class _FailedOn(Exception):
    """A rank's forward pass raised on one trial's inputs."""

    def __init__(self, inputs: str, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.inputs = inputs
        self.error = error


def run_reference(
    reference: nn.Module, trials: list[tuple[str, Any]], module_path: str
) -> list[tuple[str, Any, list[Any], dict[str, Any]]]:
    """The reference on every trial: (description, inputs, flattened outputs, values captured at
    `module_path`). Raises NumericRunError when the reference itself cannot run them."""
    runs = []
    for description, inputs in trials:
        captured: dict[str, Any] = {}
        hook = hook_module(reference, module_path, captured, "reference")
        try:
            outputs, _ = tree_flatten(reference(*inputs))
        except Exception as exc:  # noqa: BLE001 - reported as the reason no witness exists
            raise NumericRunError(
                f"the reference fails with real numbers on {description}: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            if hook is not None:
                hook.remove()
        runs.append((description, inputs, outputs, captured))
    return runs


def _one_seed(
    reference: nn.Module,
    trials: list[tuple[str, Any]],
    build_parallel: Callable[..., Any],
    world_size: int,
    relation_override: RelationOverride,
    module_path: str,
    compare: Callable[[list[Any], list[list[Any]], dict[str, Any]], NumericComparison],
) -> list[NumericComparison]:
    """Every trial of one seed: the reference runs them, every rank is built once and runs them."""
    runs = run_reference(reference, trials, module_path)
    copies = [copy.deepcopy(reference) for _ in range(world_size)]

    def forward(module: nn.Module, rank: int) -> list[list[Any]]:
        outputs = []
        for description, inputs, _, captured in runs:
            hook = hook_module(module, module_path, captured, f"rank{rank}")
            try:
                with torch.no_grad():
                    flat, _ = tree_flatten(global_values(module(*inputs)))
            except Exception as exc:  # a rank that fails where the reference runs
                raise _FailedOn(description, exc) from exc
            finally:
                if hook is not None:
                    hook.remove()
            outputs.append(flat)
        return outputs

    try:
        per_rank = run_ranks(copies, build_parallel, world_size, relation_override, forward)
    except RankFailure as failure:
        if not failure.inputs:
            raise
        return [NumericComparison(world_size, "", inputs=failure.inputs, failure=str(failure))]
    comparisons = []
    for index, (description, _, reference_outputs, captured) in enumerate(runs):
        comparison = compare(reference_outputs, [outputs[index] for outputs in per_rank], captured)
        comparison.inputs = description
        comparisons.append(comparison)
    return comparisons


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
    failures: list[tuple[str, str]] = []  # (message, the inputs a forward pass failed on, or "")
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
            shown = isinstance(exc, _FailedOn) and not harness_failure(exc.error)
            with lock:  # the first failure is the cause: the others are ranks it woke
                failures.append((f"rank {rank}: {exc}", exc.inputs if shown else ""))
            _wake_other_ranks(exc)
        except SystemExit:
            pass  # the threaded process group ends the ranks a failing rank woke this way
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    with keep_excepthook(), _threaded_world() as store, _point_to_point(world_size), _shared_loss_parallel():
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
            raise RunTimedOut(
                f"the ranks did not finish within {RUN_TIMEOUT_SECONDS:.0f} s (a collective that not every rank "
                "calls waits forever)"
            )
    if failures:
        message, inputs = failures[0]
        if inputs:
            raise RankFailure(f"{message} (the reference runs these inputs)", inputs)
        raise RankFailure("running the ranks with real numbers failed: " + "; ".join(m for m, _ in failures[:2]))
    return outputs


def harness_failure(error: BaseException) -> bool:
    """Whether a rank's exception may come from running it here rather than from its program: an
    operation the in-process process group or the threads do not implement, raised inside
    torch.distributed or torch's testing utilities."""
    if isinstance(error, NotImplementedError):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return any(
        f"torch{sep}distributed{sep}" in frame.filename or f"torch{sep}testing{sep}" in frame.filename
        for frame in frames
        for sep in ("/", "\\")
    )
