"""Ground truth of the localization corpus: every case's program run for real on a gloo group
(tests/corpus/ground_truth.py) as written, where it must differ from its reference, and with its
one line replaced by the case's fix (in a copy of the corpus), where it must agree.

    python tests/corpus/localization/record.py [--write] [NAME ...]

prints each case and world size with both errors; `--write` records them in GROUND_TRUTH.json
as {name: {world_size: {"bug": err, "fixed": err}}}."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/corpus: ground_truth

from ground_truth import checks, run  # noqa: E402

RECORD = HERE / "GROUND_TRUTH.json"
DIFFERS, AGREES = 1e-6, 1e-9


def cases() -> list[dict]:
    return tomllib.loads((HERE / "CASES.toml").read_text())["case"]


def line_number(case: dict, corpus: Path = HERE) -> int:
    """The 1-based line of `case["file"]` holding its `line` substring (which occurs once)."""
    text = (corpus / case["file"]).read_text()
    assert text.count(case["line"]) == 1, (case["name"], text.count(case["line"]))
    return text[: text.index(case["line"])].count("\n") + 1


def fixed_copy(case: dict, into: Path) -> Path:
    """A copy of the corpus under `into` with the case's line replaced by its fix."""
    corpus = into / "localization"
    shutil.copytree(HERE, corpus, ignore=shutil.ignore_patterns("__pycache__", "GROUND_TRUTH.json"))
    path = corpus / case["file"]
    lines = path.read_text().split("\n")
    lines[line_number(case) - 1] = case["fix"]
    path.write_text("\n".join(lines))
    return corpus


def measure(case: dict, world_size: int) -> dict[str, float]:
    (check,) = [c for c in checks(HERE) if c["name"] == case["name"]]
    bug = run(check, world_size, HERE)
    with tempfile.TemporaryDirectory() as scratch:
        fixed = run(check, world_size, fixed_copy(case, Path(scratch)))
    return {"bug": bug, "fixed": fixed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    sizes = {c["name"]: c["world-sizes"] for c in checks(HERE)}
    for case in cases():
        if args.names and case["name"] not in args.names:
            continue
        for world_size in sizes[case["name"]]:
            try:
                entry = measure(case, world_size)
            except Exception as error:  # noqa: BLE001 (a crashing program: reported, not recorded)
                print(f"{case['name']} @ {world_size}: FAILED {type(error).__name__}: {error}"[:400], flush=True)
                continue
            ok = entry["bug"] > DIFFERS and entry["fixed"] <= AGREES
            errors = f"bug {entry['bug']:.3g} fixed {entry['fixed']:.3g}"
            print(f"{case['name']} @ {world_size}: {errors} {'ok' if ok else 'BAD'}", flush=True)
            record.setdefault(case["name"], {})[str(world_size)] = entry
            if args.write:
                RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
