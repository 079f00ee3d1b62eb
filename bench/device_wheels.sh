#!/usr/bin/env bash
# Builds .whl/: the packages the H200 device machine lacks (it has torch 2.11 and Python 3.12, no DeepSpeed,
# submitit, pydantic, hjson or transformers), as wheels for cp312 manylinux x86-64, at the versions this venv tests
# with (a package not installed here is left out with a line).
# bench/gpu_check.sh installs them there (pip --no-index --target /tmp/site). Run here, from the repo root:
#   bash bench/device_wheels.sh        then carry .whl in the device call
# .whl/ is ignored through .git/info/exclude (local to this clone), so it never lands in a commit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
version() { "$PY" -c "from importlib.metadata import version; print(version('$1'))"; }
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
# DeepSpeed is an sdist whose ops are JIT-built at run time; its wheel is pure Python and needs no CUDA here
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$(version deepspeed)"
pkgs=()
# transformers and what it imports (implementation: transformers cells; issue 53)
for p in submitit hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions \
    transformers huggingface-hub tokenizers safetensors regex tqdm filelock fsspec packaging pyyaml numpy \
    hf-xet typer httpx httpcore h11 anyio idna certifi sniffio click shellingham rich markdown-it-py mdurl pygments; do
  v=$(version "$p" 2>/dev/null) && pkgs+=("$p==$v") || echo "not installed here, left out: $p"
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pkgs[@]}"
ls -1 .whl
du -sh .whl
