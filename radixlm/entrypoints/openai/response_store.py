"""Stored responses of /v1/responses: `store` (true by default, as OpenAI's) and
`previous_response_id`, in memory with a bound and an expiry.

Each stored response keeps its response object (for GET /v1/responses/{id}) and
the conversation it ended (its input messages and its output as assistant
turns), which a request naming it as `previous_response_id` continues. As in
OpenAI's API, the earlier request's `instructions` are not carried over.

Bound: at most `max_entries` responses (the oldest go first) and each for at
most `ttl_s` seconds; a response gone is a 404 like one never stored. Nothing
survives a restart.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple


class StoredResponse(NamedTuple):
    response: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation through this response's output
    stored_at: float  # time.monotonic()


class ResponseStore:
    def __init__(self, max_entries: int = 1024, ttl_s: float = 3600.0) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Keep `response` (under its id) and the conversation it ended."""
        with self._lock:
            self._expire()
            self._entries[response["id"]] = StoredResponse(response, messages, time.monotonic())
            self._entries.move_to_end(response["id"])
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            self._expire()
            return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            self._expire()
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    def _expire(self) -> None:
        """Drop what is older than ttl_s (oldest first: insertion order). Holds the lock."""
        deadline = time.monotonic() - self.ttl_s
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.stored_at >= deadline:
                break
            del self._entries[key]


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as chat turns: messages as assistant text, function
    calls as an assistant turn's tool_calls (reasoning is not replayed)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") == "message":
            text = "".join(part.get("text", "") for part in item.get("content", []))
            messages.append({"role": "assistant", "content": text})
        elif item.get("type") == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return messages
