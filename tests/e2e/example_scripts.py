"""Load an example's standalone script (its bug_variants.py) as a module under its own name, so
several examples' scripts of the same file name can be loaded side by side."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module
