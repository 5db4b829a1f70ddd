"""Which reference modules a rank's module holds, and the line that attached them.

A pipeline stage (or any builder that hands a rank part of the reference) usually keeps the
reference's own module objects: `self.layers = nn.ModuleList(reference.layers[start:end])`. How
the layers were split is Python arithmetic, invisible in any graph; the assignment that attached
them is not. `recording_attachments` watches `nn.Module.__setattr__` while the parallel builder
runs and keeps the user site of every assignment of a module value; `placements` then names, for
every outermost reference module in the rank's tree, its reference name and the site of the
assignment that attached it or the nearest container holding it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch import nn

from ..graph.model import ModulePlacement, SourceSite
from .frames import site_from_live_stack

# (id of the owning module, attribute name) -> the user site of the assignment
Attachments = dict[tuple[int, str], SourceSite | None]

_active = threading.local()  # this thread's (reference module ids, attachments) while recording
_install_lock = threading.Lock()
_recorders = 0  # threads recording now; the hook is installed while any does
_original_setattr = nn.Module.__setattr__


def _recording_setattr(self: nn.Module, name: str, value: object) -> None:
    recording = getattr(_active, "recording", None)
    if recording is not None and isinstance(value, nn.Module):
        reference_ids, recorded = recording
        # a reference module, or a container of them (a ModuleList of the reference's layers)
        if id(value) in reference_ids or any(id(child) in reference_ids for child in value.children()):
            recorded[(id(self), name)] = site_from_live_stack(skip=1)
    _original_setattr(self, name, value)


@contextlib.contextmanager
def recording_attachments(reference: nn.Module) -> Iterator[Attachments]:
    """Record where user code (on this thread) assigns a module of `reference`, or a container
    holding one, to a module attribute. Ranks may be built on several threads at once: the hook
    is installed while any thread records and records only for the threads that asked."""
    global _recorders
    with _install_lock:
        if _recorders == 0:
            nn.Module.__setattr__ = _recording_setattr  # type: ignore[method-assign]
        _recorders += 1
    recorded: Attachments = {}
    previous = getattr(_active, "recording", None)
    _active.recording = ({id(module) for module in reference.modules()}, recorded)
    try:
        yield recorded
    finally:
        _active.recording = previous
        with _install_lock:
            _recorders -= 1
            if _recorders == 0:
                nn.Module.__setattr__ = _original_setattr  # type: ignore[method-assign]


def placements(root: nn.Module, reference: nn.Module, attachments: Attachments) -> list[ModulePlacement]:
    """The outermost reference modules in `root`'s tree (the root itself excepted), each with the
    site that attached it or the nearest ancestor container of it."""
    reference_names = {id(module): name for name, module in reference.named_modules() if name}
    modules = dict(root.named_modules())
    found: list[ModulePlacement] = []
    for path, module in modules.items():
        if not path or id(module) not in reference_names:
            continue
        parent_path = path.rpartition(".")[0]
        if parent_path and id(modules[parent_path]) in reference_names:
            continue  # inside a placed reference module: the outer one says it
        found.append(ModulePlacement(path, reference_names[id(module)], _attachment_site(path, modules, attachments)))
    return found


def _attachment_site(path: str, modules: dict[str, nn.Module], attachments: Attachments) -> SourceSite | None:
    """The site of the assignment of `path` or of its nearest ancestor that was assigned."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        owner = modules.get(".".join(parts[: end - 1]))
        if owner is None:
            continue
        site = attachments.get((id(owner), parts[end - 1]))
        if site is not None:
            return site
    return None
