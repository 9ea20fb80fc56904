"""Small process helpers shared by the entry points and the child processes."""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PortArgs:
    """ZMQ endpoints of one engine instance (IPC sockets in a private folder)."""

    tokenizer_input: str
    scheduler_input: str
    detokenizer_input: str

    @classmethod
    def create(cls) -> PortArgs:
        folder = tempfile.mkdtemp(prefix="radixlm-ipc-")
        return cls(
            tokenizer_input=f"ipc://{folder}/tokenizer",
            scheduler_input=f"ipc://{folder}/scheduler",
            detokenizer_input=f"ipc://{folder}/detokenizer",
        )

    @property
    def folder(self) -> str:
        return os.path.dirname(self.tokenizer_input.removeprefix("ipc://"))


def configure_logging(level: str = "info", prefix: str = "") -> None:
    tag = f"[{prefix}] " if prefix else ""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {tag}%(levelname)s %(name)s: %(message)s",
        force=True,
    )


def parent_alive(parent_pid: int) -> bool:
    """True while the process that started us is still our parent."""
    return os.getppid() == parent_pid


def resolve_lazy(entry: Any) -> Any:
    """A registry entry: the object itself, or a "module:Name" string imported now
    (registries name their classes this way so a lookup imports only what it uses)."""
    if not isinstance(entry, str):
        return entry
    module_name, _, name = entry.partition(":")
    return getattr(importlib.import_module(module_name), name)
