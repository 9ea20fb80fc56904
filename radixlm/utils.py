"""Small process helpers shared by the entry points and the child processes."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass


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
