"""Depth on the libraries' own layers: the bundled DeepSpeed AutoTP (a transformers Llama),
fairscale and Megatron-core examples at more layers, verified block by block (memoized) and with
every layer traced (`--no-memoize`).

Each row is `shardproof verify --json` in a fresh process (end-to-end wall time), cache off, on a
project generated here whose builders are the examples' own with the layer count changed.

    python bench/bench_library_depth.py [--layers 2 16] [--world-size 4] [--runs 1] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

BUILDERS = """
import os

LAYERS = int(os.environ["DEPTH_LAYERS"])


def autotp_reference():
    from ds_autotp.model import Logits, tiny_config
    from transformers import LlamaForCausalLM

    return Logits(LlamaForCausalLM(tiny_config(layers=LAYERS)).eval())


def fairscale_model():
    from fs_llama.model import ModelArgs, build

    return build(ModelArgs(n_layers=LAYERS))


def megatron_model():
    from mg_gpt.model import GPTArgs, build

    return build(GPTArgs(layers=LAYERS))
"""

CHECKS = {
    # a transformers Llama sharded by DeepSpeed AutoTP, against the model without tensor parallelism
    "deepspeed-autotp": (
        'reference = "depth:autotp_reference"\nparallel = "ds_autotp.parallel:autotp"\n'
        'inputs = "ds_autotp.model:example_inputs"'
    ),
    # fairscale's model-parallel layers, against the same code at world size 1
    "fairscale-llama3": (
        'parallel = "depth:fairscale_model"\nreference = { world-size = 1 }\ninputs = "fs_llama.model:example_inputs"'
    ),
    # Megatron-core's tensor-parallel layers, against the same code at world size 1
    "megatron-tp": (
        'parallel = "depth:megatron_model"\nreference = { world-size = 1 }\ninputs = "mg_gpt.model:example_inputs"'
    ),
}

EXAMPLE_DIRS = ("deepspeed_autotp", "fairscale_llama", "megatron_gpt")


def write_project(root: Path, world_size: int) -> None:
    (root / "depth.py").write_text(textwrap.dedent(BUILDERS))
    paths = ", ".join(json.dumps(p) for p in [".", *(str(EXAMPLES / e) for e in EXAMPLE_DIRS)])
    checks = "".join(
        f'\n[[tool.shardproof.check]]\nname = "{name}"\n{entry}\nworld-sizes = [{world_size}]\noutputs = "replicated"\n'
        for name, entry in CHECKS.items()
    )
    (root / "pyproject.toml").write_text(f"[tool.shardproof]\npython-path = [{paths}]\n{checks}")


def run(project: Path, check: str, layers: int, memoize: bool) -> dict:
    env = dict(os.environ, SHARDPROOF_CACHE_DIR="off", DEPTH_LAYERS=str(layers))
    command = [sys.executable, "-m", "shardproof", "verify", "--project", str(project), "--check", check, "--json"]
    if not memoize:
        command.append("--no-memoize")
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    try:
        (outcome,) = json.loads(done.stdout)["checks"][0]["world_sizes"]
    except (ValueError, KeyError, IndexError):
        return {"wall": wall, "verdict": f"error: {done.stderr.strip().splitlines()[-1:]}", "stats": {}, "seconds": {}}
    return {"wall": wall, "verdict": outcome["verdict"], "stats": outcome["stats"], "seconds": outcome["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), default=sorted(CHECKS))
    args = parser.parse_args()
    import torch

    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"TP={args.world_size}, median of {args.runs} run(s), cache off\n")
    print("| check | layers | memoized | verdict | wall | capture | verification | templates / parts |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="depth-") as scratch:
        project = Path(scratch)
        write_project(project, args.world_size)
        for check in args.only:
            for layers in args.layers:
                for memoize in (True, False):
                    runs = [run(project, check, layers, memoize) for _ in range(args.runs)]
                    last = runs[-1]
                    wall = statistics.median(r["wall"] for r in runs)
                    seconds = last["seconds"]
                    stats = last["stats"]
                    units = (
                        f"{stats['templates']} template(s)"
                        if "templates" in stats
                        else f"{stats.get('parts', 1)} part(s)"
                    )
                    print(
                        f"| {check} | {layers} | {'yes' if memoize else 'no'} | {last['verdict']} | {wall:.1f} s "
                        f"| {seconds.get('capture', 0):.1f} s | {seconds.get('verification', 0):.2f} s | {units} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
