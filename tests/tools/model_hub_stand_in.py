"""A local stand-in for the Hugging Face and ModelScope endpoints tools/download_model.py talks to.

One threading HTTP server on 127.0.0.1 serves both sources' listing and download routes for one repo
(`org/tiny`), in the JSON shapes the real services answer: Hugging Face's `/api/models/{repo}/revision/
{rev}?blobs=True` (as huggingface_hub parses it) and ModelScope's `/api/v1/models/{repo}/repo/files`
(as the modelscope client's tests record it). LFS files redirect to `/cdn/{path}`, which honours Range
requests. `served` may differ from `files` to imitate corruption in transit; every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

REPO = "org/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 8}',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
    "model.safetensors": bytes(range(256)) * 300,
    "pytorch_model.bin": b"\x80\x02pickle" * 100,
    "README.md": b"# tiny\n",
    "sub/notes.txt": b"nested file\n",
}
LFS = {"model.safetensors", "pytorch_model.bin"}


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class StandIn:
    def __init__(self) -> None:
        self.files = dict(FILES)
        self.served = dict(FILES)
        self.extra_modelscope_entries: list[dict] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def paths_requested(self) -> list[str]:
        return [path for path, _ in self.requests]

    def huggingface_listing(self) -> dict:
        siblings = []
        for path, content in self.files.items():
            sibling = {"rfilename": path, "size": len(content), "blobId": git_blob_sha1(content)}
            if path in LFS:
                sibling["lfs"] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content),
                                  "pointerSize": 132}
                sibling["blobId"] = git_blob_sha1(b"version https://git-lfs.github.com/spec/v1\n")
            siblings.append(sibling)
        return {"id": REPO, "sha": COMMIT, "private": False, "siblings": siblings}

    def modelscope_listing(self) -> dict:
        entries = [{"Name": "sub", "Path": "sub", "Type": "tree", "Size": 0, "Sha256": "", "IsLFS": False}]
        entries += [{"Name": path.rsplit("/", 1)[-1], "Path": path, "Type": "blob", "Size": len(content),
                     "Sha256": hashlib.sha256(content).hexdigest(), "IsLFS": path in LFS, "Revision": COMMIT}
                    for path, content in self.files.items()]
        return {"Code": 200, "Data": {"Files": entries + self.extra_modelscope_entries}, "Message": "success",
                "RequestId": "stand-in", "Success": True}


def _handler(hub: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            hub.requests.append((self.path, {name.lower(): value for name, value in self.headers.items()}))
            url = urlsplit(self.path)
            path, query = unquote(url.path), {k: v[0] for k, v in parse_qs(url.query).items()}
            if path.startswith(f"/api/models/{REPO}/revision/"):
                return self._json(hub.huggingface_listing())
            if path.startswith(f"/{REPO}/resolve/{COMMIT}/"):
                return self._file(path.removeprefix(f"/{REPO}/resolve/{COMMIT}/"))
            if path == f"/api/v1/models/{REPO}/repo/files" and query.get("Recursive") == "True":
                return self._json(hub.modelscope_listing())
            if path == f"/api/v1/models/{REPO}/repo" and "FilePath" in query:
                return self._file(query["FilePath"])
            if path.startswith("/cdn/"):
                return self._bytes(hub.served[path.removeprefix("/cdn/")])
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()

        def _json(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _file(self, relative: str) -> None:
            if relative in LFS:
                self.send_response(302)
                self.send_header("Location", f"/cdn/{relative}")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._bytes(hub.served[relative])

        def _bytes(self, content: bytes) -> None:
            start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-")) if "Range" in self.headers else 0
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(content) - start))
            self.end_headers()
            self.wfile.write(content[start:])

    return Handler
