"""Small process helpers shared by the entry points and the child processes."""

from __future__ import annotations

import importlib
import logging
import os
import re
import shutil
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
        """Endpoints in a new folder named after this process (and remove the folders that
        dead processes left: a server killed with kill -9 cannot remove its own)."""
        _remove_stale_ipc_folders()
        folder = tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-")
        return cls(
            tokenizer_input=f"ipc://{folder}/tokenizer",
            scheduler_input=f"ipc://{folder}/scheduler",
            detokenizer_input=f"ipc://{folder}/detokenizer",
        )

    @property
    def folder(self) -> str:
        return os.path.dirname(self.tokenizer_input.removeprefix("ipc://"))


IPC_PREFIX = "radixlm-ipc-"


def _remove_stale_ipc_folders() -> None:
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        if not name.startswith(IPC_PREFIX):
            continue
        pid, sep, _ = name[len(IPC_PREFIX):].partition("-")  # "<pid>-<random>"
        if sep and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


# What an error text must not show a client (the log keeps the original).
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):.*", re.S)
_FILE_LINE = re.compile(r'\s*File "[^"]*", line \d+(?:, in [^\s,:]+)?,?')
_SOURCE_PATH = re.compile(
    r"(?:[A-Za-z]:)?(?:[\w.~+-]*[/\\])+[\w.+-]+\.(?:c|cc|cpp|cxx|cu|h|hh|hpp|py|pyx|rs|go)"
    r"(?::\d+){1,2}:?\s*")
_LOG_TIME = re.compile(r"\[\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\]\s*")
_ADDRESS = re.compile(r"\s+at 0x[0-9a-fA-F]+|\b0x[0-9a-fA-F]{9,}\b")


def public_error_text(text: str) -> str:
    """`text` without source paths, line numbers, memory addresses or tracebacks: what a
    library's exception may say, shown to a client (e.g. xgrammar's
    "[10:32:11] /project/cpp/regex_converter.cc:94: Regex parsing error ..." becomes
    "Regex parsing error ...", PIL's "<_io.BytesIO object at 0x7f...>" "<_io.BytesIO object>")."""
    text = _TRACEBACK.sub("", text)
    text = _FILE_LINE.sub("", text)
    text = _SOURCE_PATH.sub("", text)
    text = _LOG_TIME.sub("", text)
    text = _ADDRESS.sub("", text)
    return " ".join(text.split())
