"""Checkpoints from object storage: an ``s3://`` model folder copied once into a local cache
(``PADOC_RAY_MODEL_CACHE``), keyed by its URI and its objects' ETags, refusing keys that would land
outside the cache folder. Byte I/O and S3 clients are :mod:`padoc_ray.storage`'s."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

from padoc_ray.storage import StorageConfig, is_s3, s3_client, split_s3

logger = logging.getLogger(__name__)


class UnsafeKeyError(ValueError):
    """An object key that would be written outside the folder it is copied into."""


def relative_key(key: str, prefix: str) -> str | None:
    """``key`` relative to the folder ``prefix``; None for the folder's own marker object.
    Raises :class:`UnsafeKeyError` for a key that is not below ``prefix`` or whose relative part
    is absolute or has an empty, ``.`` or ``..`` part."""
    if not key.startswith(prefix + "/"):
        raise UnsafeKeyError(f"{key!r} is not below {prefix!r}/")
    rel = key[len(prefix) + 1:]
    if rel == "":
        return None
    parts = rel.rstrip("/").split("/") if rel.endswith("/") else rel.split("/")
    if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise UnsafeKeyError(f"unsafe object key {key!r}: absolute, or an empty, '.' or '..' part")
    return None if rel.endswith("/") else rel


def _list_model(client, bucket: str, prefix: str) -> list[dict]:
    """Every object of the model folder (key, rel, size, etag); raises UnsafeKeyError before
    anything is written."""
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            rel = relative_key(o["Key"], prefix)
            if rel is not None:
                out.append({"key": o["Key"], "rel": rel, "size": int(o["Size"]), "etag": o.get("ETag", "")})
    return sorted(out, key=lambda o: o["rel"])


def _inside(folder: str, rel: str) -> str:
    """The path of ``rel`` in ``folder``, checked to resolve below it."""
    dest = os.path.join(folder, *rel.split("/"))
    root = os.path.realpath(folder)
    if not os.path.realpath(dest).startswith(root + os.sep):
        raise UnsafeKeyError(f"{rel!r} resolves outside {folder}")
    return dest


def _download_model(client, bucket: str, objects: list[dict], folder: str) -> None:
    for o in objects:
        dest = _inside(folder, o["rel"])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        client.download_file(bucket, o["key"], dest)
        if os.path.getsize(dest) != o["size"]:
            raise OSError(f"s3://{bucket}/{o['key']}: got {os.path.getsize(dest)} bytes, listed {o['size']}")


#: where copies of s3:// models go (default ``~/.cache/padoc-ray/models``); one folder per node
MODEL_CACHE_ENV = "PADOC_RAY_MODEL_CACHE"


def model_cache_root() -> str:
    return os.environ.get(MODEL_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "padoc-ray", "models")


def local_model_dir(uri: str, cfg: StorageConfig = StorageConfig(), cache_root: str | None = None) -> str:
    """A local directory holding the model: ``uri`` itself, or a cached copy of an s3:// model.

    The cache is keyed on the URI plus the listing (each object's key, size and ETag), so a model
    updated at the same URI is fetched again. One process per node downloads (a file lock); the
    others wait and reuse its copy. Objects are copied key by key, each checked to land inside
    the copy's folder (keys that are absolute, empty or have a ``..`` part are refused before
    anything is written), and a failed copy is removed.
    """
    from filelock import FileLock

    if not is_s3(uri):
        if not os.path.isdir(uri):
            raise FileNotFoundError(f"model directory not found: {uri}")
        return os.path.abspath(uri)
    bucket, prefix = split_s3(uri)
    client = s3_client(cfg)
    try:
        objects = _list_model(client, bucket, prefix)
    except UnsafeKeyError as e:
        raise UnsafeKeyError(f"model {uri}: {e}; refusing to copy it") from None
    if not any(o["rel"] == "config.json" for o in objects):
        raise FileNotFoundError(f"{uri} holds no config.json: not a model directory")
    listing = json.dumps([uri, [[o["rel"], o["size"], o["etag"]] for o in objects]])
    root = cache_root or model_cache_root()
    os.makedirs(root, exist_ok=True)
    dest = os.path.join(root, hashlib.sha256(listing.encode()).hexdigest()[:20])
    done = os.path.join(dest, ".complete")
    with FileLock(dest + ".lock"):
        if os.path.exists(done):
            return dest
        # holding the lock, anything else of this key is a leftover of a killed copy
        for name in os.listdir(root):
            if name.startswith(os.path.basename(dest)) and (name.endswith(".tmp") or name == os.path.basename(dest)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        tmp = f"{dest}.{os.getpid()}.tmp"
        try:
            os.makedirs(tmp)
            _download_model(client, bucket, objects, tmp)
            with open(os.path.join(tmp, ".source.json"), "w") as f:
                f.write(listing)
            os.replace(tmp, dest)
            open(done, "w").close()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    logger.info("copied model %s to %s (%d objects)", uri, dest, len(objects))
    return dest
