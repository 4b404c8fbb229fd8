"""Where bytes live: local paths and ``s3://`` URIs through pyarrow filesystems.

Listing inputs (a folder, a glob, an ``s3://bucket/prefix``, or a manifest file of URIs), reading
one file's bytes, and fetching a model directory from S3 into a local cache. S3-compatible stores
are reached through an endpoint setting; credentials come from the standard AWS chain (env vars,
config files, instance roles) as pyarrow's S3 client resolves them, with its standard retry
strategy (exponential backoff) for transient errors. Knows nothing of PDFs, models or Ray.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    """How to reach object storage. ``endpoint`` also comes from AWS_ENDPOINT_URL(_S3)."""

    endpoint: str | None = None  #: e.g. http://127.0.0.1:9000 for an S3-compatible server
    region: str | None = None  #: default: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
    retry_attempts: int = 6  #: pyarrow's AWS standard retry strategy (exponential backoff)

    def resolved_endpoint(self) -> str | None:
        return self.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def filesystem(uri: str, cfg: StorageConfig = StorageConfig()) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or an s3:// URI."""
    if is_s3(uri):
        u = urlparse(uri)
        ep = cfg.resolved_endpoint()
        kw: dict = {
            "region": cfg.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=cfg.retry_attempts),
        }
        if ep:
            p = urlparse(ep)
            kw["endpoint_override"] = p.netloc or p.path
            kw["scheme"] = p.scheme or "https"
        return pafs.S3FileSystem(**kw), (u.netloc + u.path).rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts]) if is_s3(uri) else os.path.join(uri, *parts)


def to_uri(base_uri: str, fs_path: str) -> str:
    return f"s3://{fs_path}" if is_s3(base_uri) else fs_path


def read_bytes(uri: str, cfg: StorageConfig = StorageConfig()) -> bytes:
    fs, path = filesystem(uri, cfg)
    with fs.open_input_stream(path) as f:
        return f.read()


def write_bytes(uri: str, data: bytes, cfg: StorageConfig = StorageConfig()) -> None:
    fs, path = filesystem(uri, cfg)
    if not is_s3(uri):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic on local disks
        return
    with fs.open_output_stream(path) as f:  # an S3 object appears only when complete
        f.write(data)


class InputError(ValueError):
    """The --input names nothing readable."""


def list_inputs(spec: str, cfg: StorageConfig = StorageConfig()) -> list[tuple[str, int]]:
    """(uri, size) of every file named by ``spec``, sorted by uri.

    ``spec`` is a folder or ``s3://bucket/prefix`` (every file below it, recursively), a glob
    (``dir/*.pdf``; ``*`` and ``?`` within the last path part), or a manifest: a text file whose
    name ends in ``.txt`` or ``.manifest`` holding one URI per line (``#`` comments allowed).
    """
    if spec.endswith((".txt", ".manifest")) and not any(c in spec for c in "*?"):
        text = read_bytes(spec, cfg).decode("utf-8")
        uris = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        out = []
        for u in uris:
            fs, path = filesystem(u, cfg)
            info = fs.get_file_info(path)
            out.append((u, info.size if info.type == pafs.FileType.File else -1))  # -1: missing, recorded later
        return sorted(out)
    pattern = None
    base = spec
    last = spec.rstrip("/").rsplit("/", 1)[-1]
    if any(c in last for c in "*?["):
        base, pattern = spec.rstrip("/").rsplit("/", 1)
    fs, path = filesystem(base, cfg)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File and pattern is None:
        return [(spec, info.size)]
    if info.type != pafs.FileType.Directory and not (is_s3(base) and info.type == pafs.FileType.NotFound):
        raise InputError(f"--input {spec}: no such file or folder")
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as e:
        raise InputError(f"--input {spec}: cannot list it ({e})") from e
    out = []
    for fi in infos:
        if fi.type != pafs.FileType.File:
            continue
        if pattern is not None and (os.path.dirname(fi.path.rstrip("/")) != path.rstrip("/")
                                    or not fnmatch.fnmatch(fi.base_name, pattern)):
            continue
        if fi.base_name.startswith(".") or fi.base_name.endswith(".tmp"):
            continue
        out.append((to_uri(base, fi.path), fi.size))
    if not out:
        raise InputError(f"--input {spec}: no files found")
    return sorted(out)


def local_model_dir(uri: str, cfg: StorageConfig = StorageConfig(), cache_root: str | None = None) -> str:
    """A local directory holding the model: ``uri`` itself, or a cached copy of an s3:// model."""
    if not is_s3(uri):
        if not os.path.isdir(uri):
            raise FileNotFoundError(f"model directory not found: {uri}")
        return os.path.abspath(uri)
    root = cache_root or os.path.join(os.path.expanduser("~"), ".cache", "padoc-ray", "models")
    dest = os.path.join(root, hashlib.sha256(uri.encode()).hexdigest()[:16])
    done = os.path.join(dest, ".complete")
    if os.path.exists(done):
        return dest
    fs, path = filesystem(uri, cfg)
    tmp = f"{dest}.{os.getpid()}.tmp"
    os.makedirs(tmp, exist_ok=True)
    pafs.copy_files(path, tmp, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    if not os.path.exists(os.path.join(tmp, "config.json")):
        raise FileNotFoundError(f"{uri} holds no config.json: not a model directory")
    try:
        os.replace(tmp, dest)
    except OSError:  # another process finished first
        pass
    open(done, "w").close()
    return dest
