"""Where bytes live: local paths and ``s3://`` URIs through pyarrow filesystems.

Listing inputs (a folder, a glob, an ``s3://bucket/prefix``, or a manifest file of URIs), reading
one file's bytes, and fetching a model directory from S3 into a local cache. S3-compatible stores
are reached through an endpoint setting; credentials come from the standard AWS chain (env vars,
config files, instance roles) as pyarrow's S3 client resolves them, with its standard retry
strategy (exponential backoff) for transient errors. Knows nothing of PDFs, models or Ray.

Inputs written by someone else are not trusted: a manifest may only name URIs under allowed
prefixes (by default its own folder), URIs are normalized before they become keys, and a model
copied from object storage refuses keys that would land outside its cache folder.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlparse

import pyarrow.fs as pafs

logger = logging.getLogger(__name__)

#: listing sizes that are not sizes (each becomes a row with its own code, see pipeline/limits.py):
MISSING = -1  #: a manifest line naming nothing (or a dangling link that is followed)
DISALLOWED = -2  #: a manifest line naming a URI it may not name
SYMLINK = -3  #: a symbolic link, not followed (--follow-symlinks is off)
SYMLINK_OUTSIDE = -4  #: a symbolic link whose target is outside the input folder (never read)
DUPLICATE = -5  #: a followed link to a file or folder listed already (listed once)
NOT_REGULAR = -6  #: not a regular file: a FIFO, socket or device (never opened)


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    """How to reach object storage. ``endpoint`` also comes from AWS_ENDPOINT_URL(_S3)."""

    endpoint: str | None = None  #: S3-compatible endpoint URL, e.g. http://127.0.0.1:9000 (credentials: the AWS chain)
    region: str | None = None  #: default: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
    #: attempts per request (the first one included) in the AWS standard retry mode, for both clients:
    #: pyarrow's (inputs, Parquet) and boto3's (model copies, the output lock). Throttling (503 SlowDown),
    #: other 5xx answers and dropped connections are retried with jittered exponential backoff; through a
    #: proxy refusing ~11% of requests, never more than twice in a row, every request got through (tests/test_multinode.py)
    retry_attempts: int = 6
    #: one file's whole read, local or s3://, must finish within this (then read_failed, retried by a
    #: rerun); also pyarrow's S3 connect/request time-out. 512 MiB (the file-size cap) at 2 MB/s fits
    read_timeout_s: float = 300.0

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


def _parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0] if is_s3(uri) else os.path.dirname(os.path.abspath(uri))


def manifest_entry(line: str, manifest: str, allowed: Sequence[str]) -> tuple[str, bool]:
    """(normalized URI, whether the manifest may name it) for one manifest line.

    A line without a scheme is relative to the manifest's folder: a local path in a local
    manifest, a key in an ``s3://`` one. A line is allowed only when it lies under one of
    ``allowed`` (default: the manifest's own folder, hence of the manifest's own scheme); other
    schemes, and ``s3://`` keys with empty, ``.`` or ``..`` parts, never are.
    """
    if _SCHEME.match(line):
        uri = line
    elif is_s3(manifest):
        uri = _parent(manifest) + "/" + line if not line.startswith("/") else line  # "/x": no key, refused below
    else:
        uri = os.path.normpath(os.path.join(_parent(manifest), line))
    prefixes = [normalize_uri(p) for p in allowed] or [_parent(normalize_uri(manifest))]
    ok = (not is_s3(uri) or s3_key_is_plain(uri)) and any(under_prefix(uri, p) for p in prefixes)
    return uri, ok


def is_manifest(spec: str) -> bool:
    return spec.endswith((".txt", ".manifest")) and not any(c in spec for c in "*?")


def walks_folder(spec: str) -> bool:
    """Whether ``spec`` is listed by walking a local folder or glob, where a link is a row of its own (not a
    manifest, one named file, or s3://): its files are read without following a link in their place."""
    if is_s3(spec) or is_manifest(spec):
        return False
    last = spec.rstrip("/").rsplit("/", 1)[-1]
    return any(c in last for c in "*?[") or os.path.isdir(spec)


def walk_root(spec: str) -> str | None:
    """The folder a folder or glob ``spec`` is walked from (every listed file is below it), else None."""
    if not walks_folder(spec):
        return None
    spec = spec.rstrip("/") or "/"
    folder, _, last = spec.rpartition("/")
    if any(c in last for c in "*?["):
        return os.path.abspath(folder or ("/" if spec.startswith("/") else "."))
    return os.path.abspath(spec)


def output_inside_input(input_spec: str, output: str) -> bool:
    """Whether the job's outputs would be listed as its own inputs: ``output`` at or below a folder
    ``--input`` (listed recursively), or equal to the folder of a glob (which lists that folder only)."""
    if not input_spec or not output or is_manifest(input_spec):
        return False
    spec, out = input_spec.rstrip("/") or "/", normalize_uri(output)
    folder, _, last = spec.rpartition("/")
    if any(c in last for c in "*?["):
        base = normalize_uri(folder or ("/" if spec.startswith("/") else "."))
        return under_prefix(out, base) and under_prefix(base, out)
    return under_prefix(out, normalize_uri(spec))


def _walk_local(root: str, pattern: str | None, follow_symlinks: bool) -> list[tuple[str, int, int]]:
    """Every entry below ``root`` (``pattern``: only its own entries matching it), without following
    symbolic links unless asked, and then only to targets inside ``root``: nothing outside the input
    folder is read, the walk ends (a folder is entered once, by device and inode), and no file is
    listed twice (real paths first: links are followed after the plain walk, and a link to something
    listed already is the duplicate). Entries not listed as files get a sentinel size (each a row)."""
    import stat

    root = os.path.abspath(root)
    real_root = os.path.realpath(root)
    st0 = os.stat(root)
    out: list[tuple[str, int, int]] = []
    seen_dirs, seen_files = {(st0.st_dev, st0.st_ino)}, set()
    stack, links = [root], []

    def take(path: str, st) -> None:
        key = (st.st_dev, st.st_ino)
        if stat.S_ISDIR(st.st_mode):
            if pattern is None:  # a glob lists its folder's files only
                seen_dirs.add(key)
                stack.append(path)
        elif stat.S_ISREG(st.st_mode):
            seen_files.add(key)
            out.append((path, st.st_size, st.st_mtime_ns // 1_000_000))
        else:
            out.append((path, NOT_REGULAR, -1))

    while stack or links:
        while stack:
            folder = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as e:
                logger.warning("cannot list %s: %s", folder, e)
                continue
            for e in entries:
                if e.name.startswith(".") or e.name.endswith(".tmp"):
                    continue
                if pattern is not None and not fnmatch.fnmatch(e.name, pattern):
                    continue
                try:
                    if e.is_symlink():
                        links.append(e.path) if follow_symlinks else out.append((e.path, SYMLINK, -1))
                        continue
                    take(e.path, e.stat(follow_symlinks=False))
                except OSError:
                    out.append((e.path, MISSING, -1))  # gone since its folder was read
        links.sort()
        while links and not stack:
            path = links.pop(0)
            if not under_prefix(os.path.realpath(path), real_root):
                out.append((path, SYMLINK_OUTSIDE, -1))
                continue
            try:
                st = os.stat(path)  # the target
            except OSError:
                out.append((path, MISSING, -1))  # dangling
                continue
            if (st.st_dev, st.st_ino) in (seen_dirs if stat.S_ISDIR(st.st_mode) else seen_files):
                out.append((path, DUPLICATE, -1))
            else:
                take(path, st)
    return sorted(out)


def _mtime_ms(info) -> int:
    """A FileInfo's modification time in ms since the epoch (-1: the store gives none)."""
    ns = getattr(info, "mtime_ns", None)
    return ns // 1_000_000 if ns is not None else -1


def list_inputs(spec: str, cfg: StorageConfig = StorageConfig(), allowed_prefixes: Sequence[str] = (), *,
                follow_symlinks: bool = False, mtimes: bool = False) -> list[tuple]:
    """(uri, size) of every file named by ``spec``, sorted by uri; local URIs are absolute paths. With
    ``mtimes``: (uri, size, modification time in ms since the epoch; -1 when unknown or for a sentinel
    size). The batch job records size and time with each input's rows, and reads an input again when
    either differs in a later listing (a file replaced under the same name).

    A local folder or glob is walked without following symbolic links: each link is listed with
    size :data:`SYMLINK` (a row of its own, never read). With ``follow_symlinks`` a link is
    followed only when its target is inside the folder (else :data:`SYMLINK_OUTSIDE`), a folder is
    entered once (a link back to one walked already, or to a file listed already, is
    :data:`DUPLICATE`), so the walk ends and lists no file twice. FIFOs, sockets and devices are
    :data:`NOT_REGULAR` (never opened).

    ``spec`` is a folder or ``s3://bucket/prefix`` (every file below it, recursively), a glob
    (``dir/*.pdf``; ``*`` and ``?`` within the last path part), or a manifest: a text file whose
    name ends in ``.txt`` or ``.manifest`` holding one URI per line (``#`` comments allowed).
    Manifest lines are checked by :func:`manifest_entry` against ``allowed_prefixes``: a line it
    may not name gets size :data:`DISALLOWED` (and is never looked at), a missing file
    :data:`MISSING`; the same file named twice is listed once.
    """
    out = _list(spec, cfg, allowed_prefixes, follow_symlinks)
    return out if mtimes else [(u, size) for u, size, _ in out]


def _list(spec: str, cfg: StorageConfig, allowed_prefixes: Sequence[str], follow_symlinks: bool) -> list[tuple]:
    if is_manifest(spec):
        text = read_bytes(spec, cfg).decode("utf-8")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        found: dict[str, tuple[int, int]] = {}
        for line in lines:
            uri, ok = manifest_entry(line, spec, allowed_prefixes)
            if uri in found:
                continue
            if not ok:
                found[uri] = (DISALLOWED, -1)
                continue
            fs, path = filesystem(uri, cfg)
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.Unknown and not is_s3(uri):  # a FIFO, socket or device
                found[uri] = (NOT_REGULAR, -1)
                continue
            found[uri] = (info.size, _mtime_ms(info)) if info.type == pafs.FileType.File else (MISSING, -1)
        return sorted((u, size, t) for u, (size, t) in found.items())
    pattern = None
    base = spec
    last = spec.rstrip("/").rsplit("/", 1)[-1]
    if any(c in last for c in "*?["):
        base, pattern = spec.rstrip("/").rsplit("/", 1)
    fs, path = filesystem(base, cfg)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File and pattern is None:
        return [(normalize_uri(spec), info.size, _mtime_ms(info))]
    if info.type == pafs.FileType.Unknown and pattern is None and not is_s3(base):
        return [(normalize_uri(spec), NOT_REGULAR, -1)]
    if info.type != pafs.FileType.Directory and not (is_s3(base) and info.type == pafs.FileType.NotFound):
        raise InputError(f"--input {spec}: no such file or folder")
    if not is_s3(base):
        out = _walk_local(path, pattern, follow_symlinks)
        if not out:
            raise InputError(f"--input {spec}: no files found")
        return out
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
        out.append((to_uri(base, fi.path), fi.size, _mtime_ms(fi)))
    if not out:
        raise InputError(f"--input {spec}: no files found")
    return sorted(out)


# ---- models from object storage -------------------------------------------------------------------------
class UnsafeKeyError(ValueError):
    """An object key that would be written outside the folder it is copied into."""


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
