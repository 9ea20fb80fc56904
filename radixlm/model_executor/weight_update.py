"""Checks for POST /update_weights_from_disk: may this checkpoint replace the served one?

A new checkpoint is taken only when it is the same model with other values:
the same model class (so the same architecture and config type) and exactly
the same tensors, by name and shape. Shapes are read from the safetensors
headers before any weight is loaded, so a wrong checkpoint is refused without
touching the served model (a `.bin` checkpoint is loaded to read them).
"""

from __future__ import annotations

import os

from radixlm.model_loader.loader import CheckpointShapes, iterate_weights

LOAD_FORMATS = ("auto", "safetensors", "pt")


def read_shapes(model_dir: str, load_format: str | None) -> CheckpointShapes:
    """Every tensor's shape; raises ValueError (bad format) or FileNotFoundError."""
    fmt = load_format or "auto"
    if fmt not in LOAD_FORMATS:
        raise ValueError(f"Unsupported load_format {fmt!r}; choose from {list(LOAD_FORMATS)}")
    shapes = CheckpointShapes()
    from radixlm.model_loader.loader import _weight_files

    files, kind = _weight_files(model_dir)
    if fmt == "safetensors" and kind != "safetensors" or fmt == "pt" and kind != "bin":
        raise ValueError(f"load_format {fmt!r} asks for {fmt} weights, but {model_dir} holds "
                         f"{kind} files")
    if kind == "gguf":
        from radixlm.model_loader.gguf_convert import gguf_shapes

        shapes.update(gguf_shapes(files[0]))
    elif kind == "safetensors":
        from safetensors import safe_open

        for path in files:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    shapes[name] = tuple(f.get_slice(name).get_shape())
    else:
        for name, tensor in iterate_weights(model_dir):
            shapes[name] = tuple(tensor.shape)
    return shapes


def check_replacement(served_cls: type, served_shapes: CheckpointShapes, new_cls: type,
                      new_shapes: CheckpointShapes) -> str | None:
    """Why the new checkpoint cannot replace the served one, or None if it can."""
    if new_cls is not served_cls:
        return (f"The checkpoint is a {new_cls.__name__}, but the server runs a "
                f"{served_cls.__name__}; only weights of the same architecture can be loaded")
    diff = served_shapes.first_difference(new_shapes)
    if diff is not None:
        return f"The checkpoint's weights differ in shape from the served model's: {diff}"
    return None


def describe_path(model_path: str) -> str:
    return model_path if os.path.isabs(model_path) else os.path.abspath(model_path)
