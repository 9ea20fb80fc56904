"""A model path → the Hugging Face folder the loaders read.

A folder is used as it is; a GGUF file (None: the default model, see
radixlm/default_model.py) is converted once into a cache folder (gguf_convert.py,
imported only then: it needs torch, which the HTTP process does not load for this).
"""

from __future__ import annotations

import os

from radixlm.default_model import default_model_path


def is_gguf_file(path: str) -> bool:
    """True for a file that starts with the GGUF magic bytes."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def resolve_model_dir(model_path: str | None, convert_in_child: bool = False) -> str:
    """A Hugging Face folder for model_path: a folder as is; a GGUF file (None: the default
    model) converted once into a cache folder (see gguf_convert.py), whose path is returned.

    `convert_in_child` (the HTTP process): a first conversion runs in a forked child, so
    the modules it imports (transformers' config classes and, with them, its
    model-loading stack: ~70 MB) do not stay in this process for its lifetime; where
    the child fails, the conversion runs here and raises what went wrong."""
    path = os.path.expanduser(model_path) if model_path is not None else default_model_path()
    if os.path.isdir(path):
        return path
    if is_gguf_file(path):
        from radixlm.model_loader.gguf_convert import convert_gguf, gguf_cache_dir

        if convert_in_child and not os.path.isfile(os.path.join(gguf_cache_dir(path), "config.json")):
            _convert_in_child(path)
        return convert_gguf(path)
    raise FileNotFoundError(f"model path {path!r} is neither a Hugging Face folder nor a GGUF file")


CONVERT_TIMEOUT_S = 300.0


def _convert_in_child(path: str) -> None:
    import multiprocessing

    from radixlm.model_loader.gguf_convert import convert_gguf

    # fork: the child has this process's imports (torch among them) and starts at once
    child = multiprocessing.get_context("fork").Process(target=convert_gguf, args=(path,),
                                                        name="radixlm-gguf-convert")
    child.start()
    child.join(CONVERT_TIMEOUT_S)
    if child.is_alive():  # (a conversion takes seconds) the caller converts in-process
        child.kill()
        child.join()
