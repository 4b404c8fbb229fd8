"""Where bytes live: local paths and ``s3://`` URIs through pyarrow filesystems.

Reading one file's bytes (with a deadline, refusing a file that changes while it is read or, from a
walked input folder, one reached through a link), writing bytes, URIs as keys, and S3 clients. Listing
inputs is :mod:`padoc_ray.listing`'s, fetching a model from S3 :mod:`padoc_ray.modelstore`'s. S3-compatible stores
are reached through an endpoint setting; credentials come from the standard AWS chain (env vars,
config files, instance roles) as pyarrow's S3 client resolves them, with its standard retry
strategy (exponential backoff) for transient errors. Knows nothing of PDFs, models or Ray.

Inputs written by someone else are not trusted: URIs are normalized before they become keys, and a
read never follows what it was told not to follow.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs
from padoc_ray.knobs import knob

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    """How to reach object storage. ``endpoint`` also comes from AWS_ENDPOINT_URL(_S3)."""

    #: S3-compatible endpoint URL, e.g. http://127.0.0.1:9000 (credentials: the AWS chain)
    endpoint: str | None = knob(None, flags=("--s3-endpoint",), dest="s3_endpoint",
                                default_text="AWS_ENDPOINT_URL(_S3), else AWS")
    region: str | None = None  #: default: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
    #: attempts per request (the first one included) in the AWS standard retry mode, for both clients:
    #: pyarrow's (inputs, Parquet) and boto3's (model copies, the output lock). Throttling (503 SlowDown),
    #: other 5xx answers and dropped connections are retried with jittered exponential backoff; through a
    #: proxy refusing ~11% of requests, never more than twice in a row, every request got through (tests/cluster/pipeline/test_two_node_cluster.py)
    retry_attempts: int = 6
    #: one file's whole read, local or s3://, must finish within this (then read_failed, retried by a
    #: rerun); also pyarrow's S3 connect/request time-out. 512 MiB (the file-size cap) at 2 MB/s fits
    read_timeout_s: float = knob(300.0, flags=("--read-timeout",), metavar="SECONDS")

    def __post_init__(self) -> None:
        if not self.read_timeout_s > 0:
            raise ValueError("read_timeout_s must be > 0")

    def resolved_endpoint(self) -> str | None:
        return self.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")

    def resolved_region(self) -> str:
        return self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def filesystem(uri: str, cfg: StorageConfig = StorageConfig()) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or an s3:// URI."""
    if is_s3(uri):
        u = urlparse(uri)
        ep = cfg.resolved_endpoint()
        kw: dict = {
            "region": cfg.resolved_region(),
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=cfg.retry_attempts),
            "connect_timeout": cfg.read_timeout_s, "request_timeout": cfg.read_timeout_s,
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


class NotRegularFile(OSError):
    """The path is (now) a FIFO, socket, device or folder: it is never read."""


class LinkAtRead(OSError):
    """The path is (now) a symbolic link, and links are not followed: it is never read (a listed file
    swapped for a link after the listing would otherwise be read wherever the link points)."""


class ChangedDuringRead(OSError):
    """The file changed while it was read (size, modification time or identity): the bytes are a mix."""


_CHUNK = 4 << 20


class LinkOutside(LinkAtRead):
    """With links followed, the path now leads outside the input folder (a link swapped after the listing)."""


def _open_beneath(root: str, path: str, flags: int) -> tuple[int, int, str]:
    """Open ``path`` (below ``root``) one component at a time from a descriptor of ``root``, following no
    link on the way (``O_NOFOLLOW`` on each folder and on the file): a folder on the path swapped for a
    link after the listing is refused like the file itself. Returns (file descriptor, descriptor of its
    folder, its name there); the caller closes both."""
    import errno

    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if rel.startswith("..") or os.path.isabs(rel) or not parts or "" in parts:
        raise LinkAtRead(f"{path} is not below the input folder {root}: not read")
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))  # the root as the user named it
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nfd = os.open(part, dir_flags, dir_fd=dfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(os.path.join(root, *parts[:i + 1])):
                    raise LinkAtRead(f"{os.path.join(root, *parts[:i + 1])} (a folder on the path of {path}) is a "
                                     f"symbolic link, which this run does not follow: not read") from None
                raise
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LinkAtRead(f"{path} is a symbolic link, which this run does not follow: not read") from None
            raise
    except BaseException:
        os.close(dfd)
        raise
    return fd, dfd, parts[-1]


def _read_local(path: str, limit: int | None, deadline: float, follow_links: bool = True,
                root: str | None = None) -> bytes:
    """Open without blocking (a FIFO swapped in after the listing would block ``open``) and, unless
    ``follow_links``, without following a link in the file's own place (``O_NOFOLLOW``: a file swapped
    for a link after the listing is refused, not read where the link points); with ``root`` as well,
    without following one on the folders between ``root`` and the file either (:func:`_open_beneath`).
    With ``follow_links`` and ``root``, the file opened must still be inside ``root`` (:class:`LinkOutside`).
    Check the opened descriptor (not the path: no window between check and use), read in chunks
    against the deadline, and compare the file before and after the read."""
    import errno
    import stat
    import time

    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    dfd, name = None, path
    if root is not None and not follow_links:
        fd, dfd, name = _open_beneath(root, path, flags)
    else:
        if not follow_links:
            flags |= os.O_NOFOLLOW
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if not follow_links and e.errno == errno.ELOOP:
                raise LinkAtRead(f"{path} is a symbolic link, which this run does not follow: not read") from None
            raise
    try:
        if root is not None and follow_links:
            _check_inside(fd, path, root)
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(before.st_mode) else "a folder" if stat.S_ISDIR(before.st_mode) else \
                "a socket or device"
            raise NotRegularFile(f"{path} is {kind}, not a regular file: not read")
        parts, n = [], 0
        while limit is None or n < limit:
            if time.monotonic() > deadline:
                raise TimeoutError("the read did not finish in time")
            b = os.read(fd, _CHUNK if limit is None else min(_CHUNK, limit - n))
            if not b:
                break
            parts.append(b)
            n += len(b)
        after = os.fstat(fd)
        now = os.stat(name, dir_fd=dfd, follow_symlinks=False) if dfd is not None else \
            os.stat(path, follow_symlinks=follow_links)
    finally:
        os.close(fd)
        if dfd is not None:
            os.close(dfd)
    same = (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns) and \
        (now.st_ino, now.st_dev) == (before.st_ino, before.st_dev)
    if not same or (limit is None or n < limit) and n != after.st_size:
        raise ChangedDuringRead(f"{path} changed while it was read ({before.st_size} bytes and mtime "
                                f"{before.st_mtime_ns} before, {after.st_size} bytes and mtime {after.st_mtime_ns} after"
                                f"{'' if (now.st_ino, now.st_dev) == (before.st_ino, before.st_dev) else ', replaced'})")
    return b"".join(parts)


def _check_inside(fd: int, path: str, root: str) -> None:
    """The opened file's real place (Linux: /proc/self/fd) is inside ``root``'s real place."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the path's real place, checked just after the open
        real = os.path.realpath(path)
    if not under_prefix(real, os.path.realpath(root)):
        raise LinkOutside(f"{path} now leads outside the input folder {root} (to {real}): not read")


def _read_stream(fs, path: str, limit: int | None, deadline: float) -> bytes:
    import time

    parts, n = [], 0
    with fs.open_input_stream(path) as f:  # one GET: an object version is read whole or not at all
        while limit is None or n < limit:
            if time.monotonic() > deadline:
                raise TimeoutError("the read did not finish in time")
            b = f.read(_CHUNK if limit is None else min(_CHUNK, limit - n))
            if not b:
                break
            parts.append(b)
            n += len(b)
    return b"".join(parts)


def read_bytes(uri: str, cfg: StorageConfig = StorageConfig(), *, max_bytes: int | None = None,
               follow_links: bool = True, root: str | None = None) -> bytes:
    """The file's bytes; with ``max_bytes``, at most ``max_bytes + 1`` of them (so a caller can tell
    a file that grew past a limit without holding all of it). The whole read has a deadline
    (``cfg.read_timeout_s``), on local disks and on S3: it runs in a helper thread, so even a read
    that blocks in the kernel (a stuck network mount) costs the caller the deadline, not forever.
    ``follow_links=False``: a local file that is a symbolic link is refused (:class:`LinkAtRead`); with
    ``root`` (the input folder it was listed from) so is one reached through a folder that is a link,
    and with ``follow_links`` and ``root``, one that now leads outside ``root`` (:class:`LinkOutside`).
    Raises :class:`NotRegularFile`, :class:`ChangedDuringRead`, :class:`LinkAtRead`, ``TimeoutError``
    (all OSErrors) or the storage's own OSError."""
    import concurrent.futures
    import time

    limit = None if max_bytes is None else max_bytes + 1
    deadline = time.monotonic() + cfg.read_timeout_s
    if is_s3(uri):
        fs, path = filesystem(uri, cfg)
        job = lambda: _read_stream(fs, path, limit, deadline)  # noqa: E731
    else:
        job = lambda: _read_local(os.path.abspath(uri), limit, deadline, follow_links,  # noqa: E731
                                  os.path.abspath(root) if root is not None else None)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="padoc-read")
    try:
        return pool.submit(job).result(timeout=cfg.read_timeout_s + 1)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"reading {uri} did not finish within {cfg.read_timeout_s:g} s") from None
    finally:
        pool.shutdown(wait=False)  # a read stuck in the kernel is left behind, not waited for


def write_bytes(uri: str, data: bytes, cfg: StorageConfig = StorageConfig()) -> None:
    fs, path = filesystem(uri, cfg)
    if not is_s3(uri):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"  # unique: two writers never share a temporary file
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic on local disks
        return
    with fs.open_output_stream(path) as f:  # an S3 object appears only when complete
        f.write(data)


class InputError(ValueError):
    """The --input names nothing readable (or nothing it may name)."""


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def has_scheme(uri: str) -> bool:
    """Whether ``uri`` starts with a scheme (``s3://``, ``http://``, ...): not a local path."""
    return bool(_SCHEME.match(uri))


def normalize_uri(uri: str) -> str:
    """The key form of a URI: an absolute, normalized local path (``./a.pdf`` and ``a.pdf`` are one
    file), or an ``s3://`` URI as given (object keys are literal)."""
    return uri if _SCHEME.match(uri) else os.path.abspath(uri)


def s3_key_is_plain(uri: str) -> bool:
    """No empty, ``.`` or ``..`` part in the key (clients may collapse them into another key)."""
    key = urlparse(uri).path.lstrip("/")
    return bool(urlparse(uri).netloc) and bool(key) and all(p not in ("", ".", "..") for p in key.split("/"))


def under_prefix(uri: str, prefix: str) -> bool:
    """Whether ``uri`` is ``prefix`` or below it, part by part (``s3://b/in`` does not hold
    ``s3://b/in2``). Local paths are compared after resolving symbolic links."""
    if is_s3(uri) != is_s3(prefix) or (_SCHEME.match(uri) and not is_s3(uri)):
        return False
    if is_s3(uri):
        p = prefix.rstrip("/")
        return uri == p or uri.startswith(p + "/")
    u, p = os.path.realpath(uri), os.path.realpath(prefix)
    return u == p or u.startswith(p.rstrip(os.sep) + os.sep)


# ---- S3 clients -----------------------------------------------------------------------------------------
def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key or prefix without a trailing slash)."""
    u = urlparse(uri)
    return u.netloc, u.path.strip("/")


def s3_client(cfg: StorageConfig = StorageConfig()):
    """A boto3 S3 client for the same endpoint and region as :func:`filesystem`, with the AWS
    standard retry mode."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=cfg.resolved_endpoint(), region_name=cfg.resolved_region(),
                        config=Config(retries={"mode": "standard", "max_attempts": cfg.retry_attempts}))
