"""radixlm: an LLM serving engine with a radix-tree prefix cache."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Engine", "ServerArgs"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import radixlm` stays cheap for the child processes and the CLI.
    if name == "Engine":
        from radixlm.entrypoints.engine import Engine

        return Engine
    if name == "ServerArgs":
        from radixlm.server_args import ServerArgs

        return ServerArgs
    raise AttributeError(name)
