"""Real servers on localhost for the remote-dataset tests: moto's S3 server (its own process, on a free
port), a TCP proxy in front of it that can cut or slow connections, and a plain HTTP file server that can
corrupt or drop chosen responses. Nothing here reaches past 127.0.0.1."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

# never let botocore look for credentials on the network (instance metadata lives off this machine)
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

KEY, SECRET = "testing", "testing"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``python -m moto.server`` on a free localhost port, in its own process."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start")
                time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self, endpoint: str | None = None) -> dict:
        return {"endpoint_url": endpoint or self.endpoint, "key": KEY, "secret": SECRET}

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options())

    def reset(self) -> None:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")).read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def upload(fs, local: Path, url_path: str) -> None:
    """Put a packed dataset's files under ``bucket/prefix``, the manifest last (as a writer must)."""
    names = sorted(os.listdir(local), key=lambda n: n == "manifest.json")
    for n in names:
        fs.put_file(str(local / n), f"{url_path}/{n}")


class FaultProxy:
    """A TCP proxy to ``port``: ``cut(n, after)`` closes the next n connections that carry a response
    once ``after`` bytes of its body went through (a connection dropped mid-body: before the headers,
    the HTTP client may quietly send the request again on a new connection); ``slow(delay)`` sleeps
    ``delay`` s per 16 KiB sent to the client."""

    def __init__(self, port: int):
        self.target = port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.cuts = 0
        self.cut_after = 0
        self.cut_done = 0
        self.delay = 0.0
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self, n: int, after: int) -> None:
        with self.lock:
            self.cuts, self.cut_after = n, after

    def slow(self, delay: float) -> None:
        self.delay = delay

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        armed = False
        seen = b""  # what went through since arming, up to the end of the first headers
        body = -1  # body bytes sent since the headers ended (-1: headers not complete yet)
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    break
                if downstream:
                    if not armed:
                        with self.lock:
                            if self.cuts > 0:
                                self.cuts -= 1
                                armed = True
                    if armed:
                        if body < 0:
                            seen += data
                            end = seen.find(b"\r\n\r\n")
                            if end >= 0:
                                body = len(seen) - end - 4
                        else:
                            body += len(data)
                        if body > self.cut_after:
                            with self.lock:
                                self.cut_done += 1
                            # send the headers and part of the body, then drop the connection
                            dst.sendall(data[: max(0, len(data) - (body - self.cut_after))])
                            break
                    if self.delay:
                        time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()


class FileServer:
    """A threaded HTTP server for ``root`` on a free localhost port. ``corrupt`` names files whose next
    GET gets one byte flipped; ``drop`` names files whose next GET is answered by closing the connection."""

    def __init__(self, root: Path):
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(root), **kw)

            def log_message(self, *a):
                pass

            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                with server.lock:
                    server.gets[name] = server.gets.get(name, 0) + 1
                    drop = server.drop.pop(name, 0)
                    if drop > 1:
                        server.drop[name] = drop - 1
                    corrupt = server.corrupt.pop(name, 0)
                    if corrupt > 1:
                        server.corrupt[name] = corrupt - 1
                if drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if not corrupt:
                    return super().do_GET()
                data = bytearray((root / name).read_bytes())
                data[len(data) // 2] ^= 0xFF
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(bytes(data))

        self.lock = threading.Lock()
        self.gets: dict[str, int] = {}
        self.corrupt: dict[str, int] = {}
        self.drop: dict[str, int] = {}
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
