"""A loopback HTTP server for download tests, and an isolated cache with no network settings inherited.

The server binds 127.0.0.1 on a free port and serves only what a test registered; nothing here (or in
the code under test, pointed at it) contacts any other address.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

_NETWORK_ENV = (
    "SWIN_OFFLINE",
    "HF_HUB_OFFLINE",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
)


@pytest.fixture(autouse=True)
def swin_home(tmp_path, monkeypatch):
    """Every test gets an empty cache of its own and no offline / mirror / proxy settings from outside."""
    home = tmp_path / "swin_home"
    monkeypatch.setenv("SWIN_HOME", str(home))
    for name in _NETWORK_ENV:
        monkeypatch.delenv(name, raising=False)
    return home


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    declared_length: int | None = None  # a Content-Length larger than the body: the transfer is cut off
    location: str | None = None  # a redirect, as the Hugging Face hub answers /resolve/ requests


class LoopbackServer:
    """Serves registered paths; records every request path in ``requests``; anything else is a 404."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server API)
                server.requests.append(self.path)
                route = server.routes.get(self.path)
                if route is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(route.status)
                if route.location:
                    self.send_header("Location", route.location)
                length = route.declared_length if route.declared_length is not None else len(route.body)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                self.wfile.write(route.body)
                if length != len(route.body):
                    self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    def serve(self, path: str, body: bytes = b"", **route) -> str:
        self.routes[path] = Route(body=body, **route)
        return self.url(path)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def server():
    srv = LoopbackServer()
    yield srv
    srv.close()


def torch_bytes(obj) -> bytes:
    """What ``torch.save(obj, file)`` writes."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def safetensors_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in state_dict.items()})


def cache_files(home) -> list:
    """Every file under the cache root, temporary ones included."""
    return sorted(p for p in home.rglob("*") if p.is_file()) if home.exists() else []
