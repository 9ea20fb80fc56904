"""Files of the OpenAI Files API, kept on disk under `--file-storage-path`.

    <root>/files/<id>.json    the File object (id, bytes, created_at, filename, purpose, ...)
    <root>/files/<id>.data    its content

A file survives a server restart: the store reads its folder back at start-up.
The sum of all files' sizes stays under `--file-storage-max-bytes`; a file
that would pass it is refused (`StorageFull`) and nothing is written. Ids are
`file-` plus 24 random hex digits, so a path can never be built from a
client's text: an id that does not match is simply unknown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_ID = re.compile(r"^file-[0-9a-f]{24}$")


class StorageFull(Exception):
    """Storing this would pass --file-storage-max-bytes."""


@dataclass
class FileObject:
    """OpenAI's File object."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


class FileStore:
    """Thread-safe: uploads are written from worker threads."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        self.folder = Path(root) / "files"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._files: dict[str, FileObject] = {}
        self._lock = threading.Lock()
        for meta in sorted(self.folder.glob("*.json")):
            try:
                obj = FileObject(**json.loads(meta.read_text()))
            except (ValueError, TypeError) as e:
                logger.warning("Ignoring unreadable file metadata %s: %s", meta, e)
                continue
            if self.data_path(obj.id).is_file():
                self._files[obj.id] = obj

    # ------------------------------------------------------------------ queries

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(f.bytes for f in self._files.values())

    def get(self, file_id: str) -> FileObject | None:
        with self._lock:
            return self._files.get(file_id)

    def all(self, purpose: str | None = None) -> list[FileObject]:
        """Newest first."""
        with self._lock:
            files = [f for f in self._files.values() if purpose is None or f.purpose == purpose]
        return sorted(files, key=lambda f: (f.created_at, f.id), reverse=True)

    def data_path(self, file_id: str) -> Path:
        assert _ID.match(file_id), file_id
        return self.folder / f"{file_id}.data"

    def read(self, file_id: str) -> bytes:
        return self.data_path(file_id).read_bytes()

    # ------------------------------------------------------------------ changes

    def check_room(self, num_bytes: int) -> None:
        """Raise StorageFull unless `num_bytes` more fit."""
        used = self.used_bytes
        if used + num_bytes > self.max_bytes:
            raise StorageFull(
                f"File storage is full: {num_bytes} more bytes would pass the limit of "
                f"{self.max_bytes} (now {used} used); delete files or raise "
                f"--file-storage-max-bytes")

    def create(self, data: bytes, filename: str, purpose: str) -> FileObject:
        """Store `data` as a new file (raises StorageFull)."""
        with self._lock:
            used = sum(f.bytes for f in self._files.values())
            if used + len(data) > self.max_bytes:
                raise StorageFull(
                    f"File storage is full: this file ({len(data)} bytes) would pass the "
                    f"limit of {self.max_bytes} bytes ({used} used); delete files or raise "
                    f"--file-storage-max-bytes")
            obj = FileObject(new_file_id(), len(data), int(time.time()), filename, purpose)
            self._write(obj, data)
            self._files[obj.id] = obj
        return obj

    def adopt(self, path: Path, filename: str, purpose: str) -> FileObject:
        """Move an already written file (a batch's results) into the store."""
        with self._lock:
            obj = FileObject(new_file_id(), path.stat().st_size, int(time.time()), filename,
                             purpose)
            os.replace(path, self.data_path(obj.id))
            self._write_meta(obj)
            self._files[obj.id] = obj
        return obj

    def delete(self, file_id: str) -> bool:
        with self._lock:
            obj = self._files.pop(file_id, None)
            if obj is None:
                return False
            for path in (self.folder / f"{file_id}.json", self.data_path(file_id)):
                path.unlink(missing_ok=True)
        return True

    def _write(self, obj: FileObject, data: bytes) -> None:
        tmp = self.data_path(obj.id).with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.data_path(obj.id))
        self._write_meta(obj)

    def _write_meta(self, obj: FileObject) -> None:
        meta = self.folder / f"{obj.id}.json"
        tmp = meta.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(obj.to_json()))
        os.replace(tmp, meta)
