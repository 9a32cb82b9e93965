"""A loopback HTTP server for download tests, and isolated caches with no network settings inherited.

The server binds 127.0.0.1 on a free port and serves only what a test registered; nothing here (or in
the code under test, pointed at it) contacts any other address. It answers HEAD as the Hugging Face hub
does (``X-Repo-Commit``, ``ETag`` / ``X-Linked-Etag``, ``X-Linked-Size``), so ``huggingface_hub`` can
download from it, and can misbehave on request: drip a response a byte at a time, stream forever.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tests.conftest import isolate_caches

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the X-Repo-Commit every hub answer carries


@pytest.fixture(autouse=True)
def swin_home(tmp_path, monkeypatch):
    """As tests/conftest.py's, with the caches in the test's own tmp_path (the download tests look at them
    there, beside the files they serve)."""
    return isolate_caches(monkeypatch, tmp_path)


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    declared_length: int | None = None  # a Content-Length larger than the body: the transfer is cut off
    location: str | None = None  # a redirect, as the Hugging Face hub answers /resolve/ requests
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (they win over the defaults)
    drip: float | None = None  # seconds between single bytes of the whole response, status line included
    endless: bool = False  # a body without Content-Length that never ends


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased

    def has(self, name: str) -> bool:
        return name.lower() in self.headers


def hub_headers(body: bytes, commit: str = COMMIT) -> dict[str, str]:
    """What the hub sends with a /resolve/ redirect of an LFS file: the commit, the file's sha256, its size."""
    digest = hashlib.sha256(body).hexdigest()
    return {"X-Repo-Commit": commit, "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(body))}


class LoopbackServer:
    """Serves registered paths; anything else is a 404.

    ``requests`` lists the path of every GET (the downloads); ``log`` every request, HEAD included, with its
    headers.
    """

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[str] = []
        self.log: list[Request] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> Route | None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.log.append(Request(self.command, self.path, headers))
                if self.command == "GET":
                    server.requests.append(self.path)
                return server.routes.get(self.path)

            def _head_lines(self, route: Route) -> list[tuple[str, str]]:
                lines = [("X-Repo-Commit", COMMIT), ("ETag", f'"{hashlib.sha256(route.body).hexdigest()}"')]
                target = server.routes.get(route.location) if route.location else None
                if target is not None:  # a redirect on this server: link its target as the hub does
                    lines = list(hub_headers(target.body).items())
                if route.location:
                    lines.append(("Location", route.location))
                if not route.endless:
                    length = route.declared_length if route.declared_length is not None else len(route.body)
                    lines.append(("Content-Length", str(length)))
                extra = {k.lower() for k in route.headers}
                return [(k, v) for k, v in lines if k.lower() not in extra] + list(route.headers.items())

            def _answer(self, with_body: bool) -> None:
                route = self._record()
                if route is None:
                    self.send_error(404, "Not Found")
                    return
                if route.drip is not None:
                    self._drip(route, with_body)
                    return
                self.send_response(route.status)
                for name, value in self._head_lines(route):
                    self.send_header(name, value)
                self.end_headers()
                if not with_body:
                    return
                try:
                    if route.endless:
                        while True:
                            self.wfile.write(b"\0" * 65536)
                    self.wfile.write(route.body)
                except OSError:  # the client hung up (what a client must do to an endless body)
                    self.close_connection = True
                    return
                length = route.declared_length if route.declared_length is not None else len(route.body)
                if length != len(route.body):
                    self.close_connection = True

            def _drip(self, route: Route, with_body: bool) -> None:
                lines = [f"HTTP/1.0 {route.status} OK"] + [f"{k}: {v}" for k, v in self._head_lines(route)]
                raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + (route.body if with_body else b"")
                self.close_connection = True
                try:
                    for index in range(len(raw)):
                        self.wfile.write(raw[index : index + 1])
                        self.wfile.flush()
                        time.sleep(route.drip)
                except OSError:
                    pass

            def do_GET(self) -> None:  # noqa: N802 (the http.server API)
                self._answer(with_body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(with_body=False)

            def log_message(self, *args) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # a short poll interval: close() (shutdown) returns within 50 ms instead of half a second
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

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


@pytest.fixture
def other_server():
    """A second server on another port: another origin, as a CDN or a foreign host is to the first."""
    srv = LoopbackServer()
    yield srv
    srv.close()


@pytest.fixture
def entries(monkeypatch):
    """Register test entries (sources on the loopback server) without leaking them into other tests."""
    from swin.weights import manifest

    manifest.list_pretrained()  # load the bundled manifest first
    monkeypatch.setattr(manifest, "_entries", dict(manifest._entries))

    def add(tag: str, *sources: dict, **fields) -> manifest.PretrainedEntry:
        manifest.register_pretrained({f"swin_t.{tag}": {"sources": list(sources), **fields}})
        return manifest.get_entry("swin_t", tag)

    return add


def tiny_swin_state(nan: bool = False) -> dict[str, torch.Tensor]:
    """A complete (if tiny) Swin trunk in our layout, as check_state demands; ``nan`` spoils one weight."""
    import swin

    torch.manual_seed(0)
    model = swin.create_model(
        "swin_t", depths=(1, 1, 1, 1), embed_dim=8, num_heads=(1, 1, 1, 1), num_classes=10, img_size=32, window_size=2
    )
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if nan:
        state["layers.1.blocks.0.mlp.fc1.weight"][0, 0] = float("nan")
    return state


def torch_bytes(obj) -> bytes:
    """What ``torch.save(obj, file)`` writes."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def safetensors_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in state_dict.items()})


def cache_files(home) -> list:
    """Every file under the cache root, temporary ones included; not the download locks (``.locks/``, files
    that stay, as huggingface_hub's do: removing a lock file while another process waits on it is a race)."""
    if not home.exists():
        return []
    return sorted(p for p in home.rglob("*") if p.is_file() and ".locks" not in p.relative_to(home).parts)


@pytest.fixture(scope="module")
def timm_reference():
    """timm's swin_t with random weights: (its state dict as safetensors bytes, an image, timm's logits)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224").eval()
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(image)
    return safetensors_bytes(model.state_dict()), image, logits
