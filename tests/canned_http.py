"""A loopback HTTP server whose every answer comes from a function: for client tests that need a
server replying what no healthy one would (hostile bodies, NaN rewards)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (method, path with query, request body) -> (status, response body)
Answer = Callable[[str, str, bytes], tuple[int, bytes]]


@contextmanager
def canned_server(answer: Answer, headers: list[dict[str, str]] | None = None) -> Iterator[str]:
    """Serve `answer` on 127.0.0.1 (a free port); yields the base URL. `headers`: each request's
    headers are appended there (what a client sent, e.g. its Authorization)."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if headers is not None:
                headers.append(dict(self.headers))
            status, data = answer(self.command, self.path, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _reply

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
