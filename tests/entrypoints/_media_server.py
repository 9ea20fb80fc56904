"""A loopback HTTP server for media-URL tests: files by path, redirects, slow answers.

    with MediaServer({"/cat.png": png}) as media:
        media.url + "/cat.png"           # the file
        media.url + "/redirect/cat.png"  # 302 to /cat.png
        media.url + "/slow/cat.png"      # the file after SLOW seconds
        media.hits                       # every path requested, in order
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

SLOW = 3.0  # seconds before a /slow/... answer


class MediaServer:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.hits: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                owner.hits.append(self.path)
                try:
                    owner._answer(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path
        if path.startswith("/redirect/"):
            h.send_response(302)
            h.send_header("Location", path[len("/redirect"):])
            h.end_headers()
            return
        if path.startswith("/slow/"):
            time.sleep(SLOW)
            path = path[len("/slow"):]
        body = self.files.get(path)
        if body is None:
            h.send_response(404)
            h.end_headers()
            return
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
