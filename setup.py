"""Builds radixlm's C++ CPU kernels at install: `pip install .`, `pip install -e .` and
`python -m build` compile radixlm/csrc into one library, radixlm/_cpu_kernels*.so,
for every x86-64 CPU with AVX2 (each kernel inside at the avx2, avx512 and avx512bf16
levels, the level picked at run time: csrc/isa.h), with a stamp of the sources and
the torch it was built from. radixlm/layers/cpu_kernels.py loads it, and builds the
kernels at first use instead where it is missing or stale, or where the CPU is not
covered (no AVX2, or not x86-64: nothing is built here for those).

RADIXLM_BUILD_KERNELS=0 skips the build (then the first use builds them). The
package's metadata is in pyproject.toml; this file only adds the extension.
"""

from __future__ import annotations

import importlib.util
import json
import os
from types import ModuleType
from typing import Any

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _kernel_build() -> ModuleType:
    """radixlm/layers/kernel_build.py by its path (radixlm itself is not importable yet)."""
    path = os.path.join(HERE, "radixlm", "layers", "kernel_build.py")
    spec = importlib.util.spec_from_file_location("_radixlm_kernel_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extension() -> dict[str, Any]:
    kernel_build = _kernel_build()
    if os.environ.get("RADIXLM_BUILD_KERNELS", "1") == "0" or not kernel_build.is_x86_64():
        return {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    class BuildKernels(BuildExtension):  # type: ignore[misc]
        """torch's build (ninja, jobs in parallel), then the stamp beside the library."""

        def finalize_options(self) -> None:
            super().finalize_options()
            if self.editable_mode or self.inplace:  # `pip install -e .` again: ninja
                self.build_temp = os.path.join(HERE, "build", "kernels")  # rebuilds what changed

        def run(self) -> None:
            super().run()
            stamp = json.dumps({"sources": kernel_build.source_digest(),
                                "torch": torch.__version__})
            folders = {os.path.dirname(self.get_ext_fullpath(e.name)) for e in self.extensions}
            folders.add(os.path.join(self.build_lib, "radixlm"))
            for folder in folders:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, kernel_build.STAMP_NAME), "w") as f:
                    f.write(stamp + "\n")

    sources = [os.path.relpath(path, HERE) for path in kernel_build.sources()]
    headers = [os.path.relpath(path, HERE) for path in kernel_build.source_files()
               if path.endswith(".h")]  # a changed header rebuilds too (ninja: what needs it)
    extension = CppExtension(name=f"radixlm.{kernel_build.LIBRARY_NAME}", sources=sources,
                             depends=headers, extra_compile_args=kernel_build.cflags(native=False))
    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildKernels}}


setup(**_extension())
