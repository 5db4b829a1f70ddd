"""Repeated blocks: trace one instance of each distinct block, prove the others identical to it.

A decoder repeats one block (a `TransformerBlock` in an `nn.ModuleList`) dozens of times, and
tracing every instance with `torch.export` is what makes capture grow with the number of layers.
Instead, for the reference and for every rank:

1. the model runs once eagerly on meta tensors (milliseconds per layer) while a dispatch mode
   records, for every block instance, the operations it runs: the op, its non-tensor arguments,
   and where each tensor argument comes from (a block input, one of the block's own parameters
   or buffers by its name inside the block, or an earlier result of the block). Equal records
   mean the same computation on the instance's own inputs and parameters; the first instance of
   each record is the block's *template*;
2. the model is exported with every block call replaced by one opaque operation
   (`shardproof::block`, named by template and instance) whose output shapes come from the
   eager run: the *skeleton*, small whatever the depth;
3. each template is exported on its own, with the inputs it received.

A block whose record uses a tensor that is neither its input nor its own (a module attribute
of another module, a global) is not memoized: its result could depend on something the record
does not show. So is a block with forward hooks of its own, and one whose record holds an
argument it cannot write down (an object other than a number, string, dtype, device, layout,
memory format, process group or reduction): two such arguments could differ where the records
look equal. A collective's process group is written as its ranks (also when the collective names
it by a string, which means a group only within one world) and its reduction as its kind; a
block's own tensors are written with their shapes (ranks holding shards of other sizes run other
computations even when no size appears among the operations' arguments). A block's inputs are
every tensor it receives, positional or keyword (`call_tensors`), in one order.

The run sees the program as `torch.export` sees it (`torch.compiler.is_compiling()` is true, as
in the traces of step 3): code that skips an eager-only check on values while traced
(transformers' masking asks whether the program is traced before reading a mask's values, which
meta tensors do not have) takes here the branch the traces take, and the record is of the
computation that is traced.

The program outside its blocks is recorded the same way (its operations, each block call with the
block's record, and every tensor the module holds by name and shape): ranks with equal skeleton
records trace one skeleton (capture/memoized.py). A rank-dependent number outside the blocks (a
vocabulary-parallel embedding's bounds) would make the ranks' records differ; so the modules beside
the blocks that hold tensors (an embedding, a final norm, an output layer: `lone_modules`) are
recorded and traced apart, as templates are, and put back into the skeleton's graph
(capture/inline.py): the skeleton's record holds their calls, not their operations, and ranks that
differ only inside one of them trace one skeleton and each its own module (one per process where
their records are equal too).

Every instance runs. Its operations are cheap (meta_ops.py answers an operation from an earlier
equal call), but its Python runs, and that is what makes the record a record: an instance is not
skipped because its module looks like one already recorded. "Looks like" (same classes, equal
attributes, parameters of equal shapes, equal arguments) does not make the computation the same
when the forward reads state outside its module and arguments: a module-level counter it
increments (`if CALLS == 3`), a branch on its identity (`if self is model.layers[-1]`), a shared
object the caller updates between calls, torch's global modes set by the caller. Telling those
apart would need what torch.compile's guards do (every global and attribute the forward reads,
re-checked per instance), so the record stays the per-instance run.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from . import meta_ops

_MIN_REPEATS = 2


@dataclass
class BlockInstance:
    path: str  # "layers.3"
    module: nn.Module
    digest: str = ""
    template: str = ""  # path of the instance whose graph stands for this one
    memoizable: bool = True
    args: tuple[Any, ...] = ()  # what the instance received (meta tensors), for exporting a template
    kwargs: dict[str, Any] = field(default_factory=dict)
    outputs: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    output_spec: pytree.TreeSpec | None = None
    # a module outside the repeated blocks, run once (see `lone_modules`): traced on its own and put
    # back into the skeleton's graph (capture/inline.py), never a template of a verified unit
    lone: bool = False
    framed: list[bool] = field(default_factory=list)  # per open call: whether it has a frame of its own

    @property
    def key(self) -> str:
        return f"{self.template}|{self.path}"


def repeated_blocks(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the children of every ModuleList / ModuleDict / Sequential with at least
    two children of one class (the layers of a decoder), outermost lists first."""
    found: list[tuple[str, nn.Module]] = []
    taken: set[str] = set()
    for path, container in module.named_modules():
        if not isinstance(container, nn.ModuleList | nn.ModuleDict | nn.Sequential):
            continue
        if any(path == t or path.startswith(t + ".") for t in taken):
            continue
        children = list(container.named_children())
        by_class: dict[type, int] = {}
        for _, child in children:
            by_class[type(child)] = by_class.get(type(child), 0) + 1
        repeated = [(name, child) for name, child in children if by_class[type(child)] >= _MIN_REPEATS]
        if repeated:
            taken.add(path)
            found.extend((f"{path}.{name}" if path else name, child) for name, child in repeated)
    return found


def lone_modules(module: nn.Module, blocks: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """(path, module) of the outermost modules beside the repeated blocks that hold tensors and no
    block: an embedding, a final norm, an output layer. Each is traced on its own (its graph shared
    by the ranks whose records of it are equal, as a template is) and put back into the skeleton,
    so that ranks whose programs differ only inside one of them (a vocabulary-parallel embedding's
    bounds) trace one skeleton between them. A module registered at two paths, or holding a tensor
    that a module outside it holds too (tied weights), stays in the skeleton: its graph would name
    the tensor otherwise than the program's."""
    holders = {""}
    for path, _ in blocks:
        parts = path.split(".")
        holders.update(".".join(parts[:end]) for end in range(1, len(parts)))
    block_paths = {path for path, _ in blocks}
    paths_of: dict[int, list[str]] = {}
    for path, child in module.named_modules(remove_duplicate=False):
        paths_of.setdefault(id(child), []).append(path)
    owners: dict[int, set[str]] = {}
    for name, tensor in [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
        *tensor_attributes(module),
    ]:
        owners.setdefault(id(tensor), set()).add(name)
    found = []
    for path, child in module.named_modules():
        if path in holders or path in block_paths or path.rpartition(".")[0] not in holders:
            continue
        if isinstance(child, nn.ModuleList | nn.ModuleDict) or len(paths_of[id(child)]) > 1:
            continue
        own = [*child.parameters(), *child.buffers(), *(t for _, t in tensor_attributes(child))]
        prefix = path + "."
        if own and all(all(name.startswith(prefix) for name in owners.get(id(t), ())) for t in own):
            found.append((path, child))
    return found


class _Recorder(TorchDispatchMode):
    """Records the operations of the innermost block being run, and those of the program outside
    every block (the skeleton's record; see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[dict[str, Any]] = []

    def open_program(self, module: nn.Module, inputs: tuple[Any, ...]) -> None:
        """The outermost frame: the program's inputs, and every tensor the module holds by its
        qualified name, shape and dtype (what export lifts)."""
        self._push(None, module, (inputs, {}))

    def open(self, instance: BlockInstance, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if instance.lone and (len(self.frames) != 1 or instance.digest):
            # called from inside another frame, or again: its operations are recorded where it runs
            instance.memoizable = False
            instance.framed.append(False)
            return
        instance.framed.append(True)
        if self.frames:  # the call, as the frame around the block sees it
            outer = self.frames[-1]
            outer["lines"].append(f"call {instance.path} {self._describe(outer, pytree.tree_leaves((args, kwargs)))}")
        self._push(instance, instance.module, (args, kwargs))

    def _push(self, instance: BlockInstance | None, module: nn.Module, arguments: Any) -> None:
        names: dict[int, str] = {}
        keep: list[Any] = []
        flat, spec = pytree.tree_flatten(arguments)
        for position, value in enumerate(flat):
            if isinstance(value, torch.Tensor):
                names.setdefault(id(value), f"in{position}")
                keep.append(value)
        owned = list(module.named_parameters()) + list(module.named_buffers()) + tensor_attributes(module)
        for name, tensor in owned:
            # the shape is part of the name: ranks holding shards of other sizes are other records
            names.setdefault(id(tensor), f"own:{name}:{_tensor_type(tensor)}")
            keep.append(tensor)
        literal = [_literal(v) if not isinstance(v, torch.Tensor) else _tensor_type(v) for v in flat]
        frame = {"instance": instance, "names": names, "keep": keep, "lines": [repr((str(spec), literal))], "count": 0}
        frame["describable"] = True
        self.frames.append(frame)
        if any(text is None for text in literal):
            self._rule_out(frame)  # an argument the record cannot tell apart from another

    @staticmethod
    def _rule_out(frame: dict[str, Any]) -> None:
        """What the frame records cannot stand for another computation with an equal record."""
        frame["describable"] = False
        if frame["instance"] is not None:
            frame["instance"].memoizable = False

    def close(self, instance: BlockInstance, output: Any) -> None:
        if instance.framed and not instance.framed.pop():
            return
        frame = self.frames.pop()
        flat, spec = pytree.tree_flatten(output)
        results = [frame["names"].get(id(v), "?") for v in flat if isinstance(v, torch.Tensor)]
        frame["lines"].append(f"out {results}")
        instance.digest = hashlib.sha256("\n".join(frame["lines"]).encode()).hexdigest()[:20]
        instance.outputs = [(tuple(v.shape), v.dtype) for v in flat if isinstance(v, torch.Tensor)]
        instance.output_spec = spec
        if any(not isinstance(v, torch.Tensor) for v in flat):
            instance.memoizable = False  # non-tensor results are not carried by the opaque op
        if self.frames:  # the frame around the block names its results by the call
            outer = self.frames[-1]
            # a lone module's own record is its graph's key, not the skeleton's (see `lone_modules`):
            # the skeleton's holds what the call gives it, the results' shapes and dtypes
            digest = f"lone {instance.outputs}" if instance.lone else instance.digest
            outer["lines"].append(f"returned {instance.path} {digest} {instance.memoizable} {spec}")
            for position, value in enumerate(v for v in flat if isinstance(v, torch.Tensor)):
                outer["names"][id(value)] = f"call:{instance.path}:{position}"
                outer["keep"].append(value)

    def close_program(self, output: Any) -> str | None:
        """The skeleton's record as a digest; None when it cannot stand for another program's."""
        frame = self.frames.pop()
        flat, spec = pytree.tree_flatten(output)
        results = [frame["names"].get(id(v), "?") for v in flat if isinstance(v, torch.Tensor)]
        if not frame["describable"] or any(not isinstance(v, torch.Tensor) for v in flat) or "?" in results:
            return None
        frame["lines"].append(f"out {results} {spec}")
        return hashlib.sha256("\n".join(frame["lines"]).encode()).hexdigest()[:32]

    def _describe(self, frame: dict[str, Any], values: list[Any], group_args: frozenset[int] = frozenset()) -> str:
        """Tensors by where they come from, everything else as a literal (see the module docstring)."""
        names: dict[int, str] = frame["names"]
        described = []
        for position, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                name = names.get(id(value))
                if name is None:
                    # a tensor from outside the frame: its value is not the block's to decide
                    self._rule_out(frame)
                    name = f"outside:{_tensor_type(value)}"
                described.append(name)
            else:
                text = _group_ranks(value) if position in group_args else _literal(value)
                if text is None:
                    self._rule_out(frame)  # an object the record cannot describe
                    text = type(value).__name__
                described.append(text)
        return repr(described)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        result = meta_ops.run(func, args, kwargs)
        if not self.frames:
            return result
        frame = self.frames[-1]
        names: dict[int, str] = frame["names"]
        op = _op(func)
        if frame["instance"] is not None:
            for position, name in op.written:
                value = args[position] if position < len(args) else kwargs.get(name)
                for written in meta_ops.leaves(value):
                    owner = names.get(id(written), "") if isinstance(written, torch.Tensor) else "v"
                    if not owner.startswith("v"):
                        # writing into an input, a parameter or a buffer (a KV cache another block or
                        # the caller may read), or into a view of one: the opaque call would hide it
                        frame["instance"].memoizable = False
        described = self._describe(frame, meta_ops.leaves(args), op.group_args)
        if kwargs:  # by name: the same values under other keywords are another call
            described += repr([(name, self._describe(frame, meta_ops.leaves(v))) for name, v in kwargs.items()])
        # a view keeps the kind of what it views (an input's view is still the input's memory)
        base = next((names.get(id(a), "") for a in args if isinstance(a, torch.Tensor)), "") if op.aliases else ""
        kind = base.split(":", 1)[0].split("~", 1)[0] if base and not base.startswith("v") else ""
        keep = frame["keep"]
        for value in meta_ops.leaves(result):
            if isinstance(value, torch.Tensor):
                names[id(value)] = f"{kind}~v{frame['count']}" if kind else f"v{frame['count']}"
                keep.append(value)
                frame["count"] += 1
        frame["lines"].append(f"{op.name} {described}")
        return result


@dataclass(frozen=True)
class _Op:
    name: str  # how the record writes the op
    written: tuple[tuple[int, str], ...]  # (position, name) of every argument the op writes
    aliases: bool  # a result is a view of an argument
    group_args: frozenset[int]  # positions of process groups named by a string (functional collectives)


_OPS: dict[Any, _Op] = {}


def _op(func: Any) -> _Op:
    op = _OPS.get(func)
    if op is None:
        schema = getattr(func, "_schema", None)
        written: tuple[tuple[int, str], ...] = ()
        aliases = False
        if schema is not None:
            if schema.is_mutable:
                written = tuple(
                    (position, argument.name)
                    for position, argument in enumerate(schema.arguments)
                    if argument.alias_info is not None and argument.alias_info.is_write
                )
            aliases = any(r.alias_info is not None for r in schema.returns)
            groups = frozenset(i for i, argument in enumerate(schema.arguments) if argument.name == "group_name")
        op = _OPS[func] = _Op(str(func), written, aliases, groups if schema is not None else frozenset())
    return op


def tensor_attributes(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Tensors kept as plain attributes (neither parameter nor buffer), by qualified name: export
    lifts them as constants under that name (Megatron's rotary `inv_freq`)."""
    found = []
    for prefix, submodule in module.named_modules(remove_duplicate=False):
        for name, value in vars(submodule).items():
            if not name.startswith("_") and isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                found.append((f"{prefix}.{name}" if prefix else name, value))
    return found


def _tensor_type(value: torch.Tensor) -> str:
    return f"{tuple(value.shape)}:{value.dtype}"


def _literal(value: Any) -> str | None:
    """How the record writes a non-tensor argument; None when it cannot say what the argument is
    (two such arguments could differ where the record shows them equal)."""
    if isinstance(value, int | float | bool | str | type(None) | torch.dtype | torch.device | torch.memory_format):
        return repr(value)
    if isinstance(value, torch.layout):
        return repr(value)
    if isinstance(value, torch.Size | list | tuple):
        items = [_literal(v) for v in value]
        return None if any(i is None for i in items) else repr(items)
    if isinstance(value, torch.ScriptObject):
        return _script_object(value)
    return None


def _group_ranks(name: Any) -> str | None:
    """A process group named by a string (functional collectives), by its ranks: a name means the
    same group only within one process group's world, and ranks build their groups by name."""
    if not isinstance(name, str):
        return None
    try:
        from .fake_pg import group_ranks

        return f"group{list(group_ranks(name))}"
    except Exception:  # noqa: BLE001 - a group we cannot resolve is one we cannot describe
        return None


def _script_object(value: torch.ScriptObject) -> str | None:
    """The collectives' process group by its ranks, and their reduction by its kind: two layers
    reducing over other groups, or with another operation, are other computations."""
    import torch.distributed as dist

    kind = value._type().qualified_name()
    try:
        if kind.endswith("c10d.ProcessGroup"):
            group = torch._C._distributed_c10d.ProcessGroup.unbox(value)
            return f"group{dist.get_process_group_ranks(group)}"
        if kind.endswith("c10d.ReduceOp"):
            op = int(value._get_method("op")())
            if op == int(dist.ReduceOp.RedOpType.PREMUL_SUM):
                return None  # its factor is not readable
            return f"reduce-op {op}"
    except Exception:  # noqa: BLE001 - an object we cannot read is one we cannot describe
        return None
    return None


@dataclass
class ProgramRecord:
    instances: list[BlockInstance]
    # the record of the program outside its blocks (its operations, the blocks it calls with their
    # records, the tensors it holds), or None when it cannot stand for another program's: a block
    # not memoized (its operations are the skeleton's but were recorded as the block's), a tensor
    # from outside the module and its inputs, an argument the record cannot write down
    skeleton: str | None


def record(module: nn.Module, inputs: tuple[Any, ...]) -> list[BlockInstance]:
    """Run the module once eagerly (on meta inputs) and record every repeated block's computation;
    instances with equal records share the first one's path as their template."""
    return [i for i in record_program(module, inputs).instances if not i.lone]


def record_program(module: nn.Module, inputs: tuple[Any, ...]) -> ProgramRecord:
    """`record`, and the record of the skeleton (see ProgramRecord)."""
    blocks = repeated_blocks(module)
    if not blocks:
        return ProgramRecord([], None)
    instances = [BlockInstance(path, block) for path, block in blocks]
    instances += [BlockInstance(path, part, lone=True) for path, part in lone_modules(module, blocks)]
    recorder = _Recorder()
    handles = []
    for instance in instances:
        if instance.module._forward_hooks or instance.module._forward_pre_hooks:
            instance.memoizable = False

        def pre(
            block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], instance: BlockInstance = instance
        ) -> None:
            instance.args, instance.kwargs = args, dict(kwargs)
            recorder.open(instance, args, kwargs)

        def post(block: nn.Module, args: Any, kwargs: Any, output: Any, instance: BlockInstance = instance) -> None:
            recorder.close(instance, output)

        handles.append(instance.module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
        handles.append(instance.module.register_forward_hook(post, with_kwargs=True, always_call=True))
    try:
        # torch.export's own switch: the program sees itself traced (see the module docstring)
        from torch._export.utils import _compiling_state_context

        with torch.no_grad(), _compiling_state_context(), recorder, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated collectives: the export reports them, once
            recorder.open_program(module, inputs)
            skeleton = recorder.close_program(module(*inputs))
    finally:
        for handle in handles:
            handle.remove()
    templates: dict[str, str] = {}
    for instance in instances:
        if not instance.digest:
            instance.memoizable = False  # never ran
        own = instance.path
        shared = instance.memoizable and not instance.lone
        instance.template = templates.setdefault(instance.digest, own) if shared else own
    if any(not instance.memoizable for instance in instances):
        skeleton = None
    return ProgramRecord(instances, skeleton)


# -- the opaque block operation ---------------------------------------------------------------------
_OUTPUTS: dict[str, list[tuple[tuple[int, ...], torch.dtype]]] = {}


@torch.library.custom_op("shardproof::block", mutates_args=())
def _block(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    raise RuntimeError("shardproof::block only stands for a block while a skeleton is traced")


@_block.register_fake
def _(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    device = inputs[0].device if inputs else torch.device("meta")
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in _OUTPUTS[key]]


class _OpaqueBlock(nn.Module):
    """Stands in for a block instance while the skeleton is traced: one `shardproof::block` call,
    and no parameters of its own, so the skeleton does not lift the block's parameters."""

    def __init__(self, instance: BlockInstance) -> None:
        super().__init__()
        self.instance = instance

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        outputs = torch.ops.shardproof.block(call_tensors(args, kwargs), self.instance.key)
        assert self.instance.output_spec is not None
        return pytree.tree_unflatten(list(outputs), self.instance.output_spec)


def call_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a block call receives, positional and keyword, in one order: its opaque call's
    inputs, and its template's (capture/memoized.py traces it with them as positional inputs)."""
    return [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]


@contextlib.contextmanager
def opaque_blocks(root: nn.Module, instances: list[BlockInstance]) -> Iterator[None]:
    """While tracing the skeleton, every memoizable instance is replaced in its parent by an
    `_OpaqueBlock`; the original modules are put back afterwards."""
    replaced: list[tuple[nn.Module, str, nn.Module, BlockInstance]] = []
    for instance in instances:
        if not instance.memoizable:
            continue
        parent_path, _, name = instance.path.rpartition(".")
        parent = root.get_submodule(parent_path)
        _OUTPUTS[instance.key] = instance.outputs
        parent._modules[name] = _OpaqueBlock(instance)
        replaced.append((parent, name, instance.module, instance))
    try:
        yield
    finally:
        for parent, name, module, instance in replaced:
            parent._modules[name] = module
            _OUTPUTS.pop(instance.key, None)


def parse_key(key: str) -> tuple[str, str]:
    template, _, path = key.partition("|")
    return template, path
