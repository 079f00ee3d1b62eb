"""The CPU dry mode of bench/gpu_check.sh: a device-check scenario shrunk to run on CPU in seconds, the same cells
by strategy, precision and checkpointing policy, with the tiny model.

    python bench/gpu_check_dry.py scenarios/gpu-check-small.yaml OUT.yaml

Every model becomes `tiny` (the 13b out-of-memory cell too: on CPU it runs ok), but a model trained through the
transformers class (`implementation: transformers`), which becomes a tiny Qwen2 config through that class, so the
dry run exercises the transformers path too, and a factory model (`factory:`), which keeps its factory at its default
(tiny) arguments; micro-batch 2 x 64 tokens, the
minimum of two warmup and two measured steps. The scenario is read and written as YAML data; `harness sweep`
validates it as any other. Every part's dry scenario is named gpu-check-dry, so the parts share one results folder
and a cell one part measured is not run again by the next. Prints the output path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

DRY_NAME = "gpu-check-dry"
DRY_SETTINGS = {"micro_batch": 2, "seq_len": 64, "warmup_steps": 2, "measure_steps": 2, "time_limit_s": 120}


TINY_HF = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf" / "tiny-qwen2.json"
"""the dry stand-in of a transformers-class model: a CPU-sized Qwen2 config"""


def shrink(doc: dict) -> dict:
    """The dry scenario of a device-check scenario document."""
    hf = {
        name: {"hf_config": str(TINY_HF), "implementation": "transformers"}
        for name, entry in (doc.get("models") or {}).items()
        if entry.get("implementation") == "transformers"
    }
    # a factory model keeps its factory at its own (tiny) default arguments
    factory = {
        name: {"factory": entry["factory"]} for name, entry in (doc.get("models") or {}).items() if "factory" in entry
    }
    hf.update(factory)
    matrix = dict(doc["matrix"])
    matrix["model"] = ["tiny"]
    matrix["include"] = [
        {
            **{k: v for k, v in cell.items() if k != "micro_batch"},
            "model": cell["model"] if cell["model"] in hf else "tiny",
        }
        for cell in matrix.get("include", [])
    ]
    # NOTE: one name for every part's dry scenario, swept into one folder: a cell another part measured already
    # (tiny shrinks 1.3b and 125m alike) keeps its ok record and is not run twice
    out = {**doc, "name": DRY_NAME, "matrix": matrix, "settings": {**doc.get("settings", {}), **DRY_SETTINGS}}
    out.pop("models", None)
    return {**out, "models": hf} if hf else out


def main(argv: list[str]) -> int:
    src, out = Path(argv[0]), Path(argv[1])
    out.write_text(yaml.safe_dump(shrink(yaml.safe_load(src.read_text())), sort_keys=False))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
