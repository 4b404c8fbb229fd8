"""What a batch job's ``--input`` names: a local folder or glob (walked without following links unless
asked), an ``s3://bucket/prefix``, or a manifest of URIs (each checked against the prefixes it may
name), as (uri, size[, modification time]) rows sorted by uri. Entries that are not files to read get
a sentinel size (a row of its own, with its code in :mod:`padoc_ray.pipeline.limits`), so every entry
is accounted for. Also where a walked input's files are read from (:func:`walk_root`). Byte I/O is
:mod:`padoc_ray.storage`'s."""

from __future__ import annotations

import fnmatch
import logging
import os
from typing import Sequence

import pyarrow.fs as pafs

from padoc_ray.storage import (StorageConfig, InputError, filesystem, has_scheme, is_s3, normalize_uri, read_bytes,
                               s3_key_is_plain, to_uri, under_prefix)

logger = logging.getLogger(__name__)

#: listing sizes that are not sizes (each becomes a row with its own code, see pipeline/limits.py):
MISSING = -1  #: a manifest line naming nothing (or a dangling link that is followed)
DISALLOWED = -2  #: a manifest line naming a URI it may not name
SYMLINK = -3  #: a symbolic link, not followed (--follow-symlinks is off)
SYMLINK_OUTSIDE = -4  #: a symbolic link whose target is outside the input folder (never read)
DUPLICATE = -5  #: a followed link to a file or folder listed already (listed once)
NOT_REGULAR = -6  #: not a regular file: a FIFO, socket or device (never opened)
UNLISTABLE = -7  #: a folder the walk could not list (no permission): its files are not known
UNDECODABLE = -8  #: a name that is not UTF-8, listed with its bytes escaped (\\xNN): rows cannot name it, never read


def _parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0] if is_s3(uri) else os.path.dirname(os.path.abspath(uri))


def manifest_entry(line: str, manifest: str, allowed: Sequence[str]) -> tuple[str, bool]:
    """(normalized URI, whether the manifest may name it) for one manifest line.

    A line without a scheme is relative to the manifest's folder: a local path in a local
    manifest, a key in an ``s3://`` one. A line is allowed only when it lies under one of
    ``allowed`` (default: the manifest's own folder, hence of the manifest's own scheme); other
    schemes, and ``s3://`` keys with empty, ``.`` or ``..`` parts, never are.
    """
    if has_scheme(line):
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


def _utf8(path: str) -> bool:
    """Whether ``path`` is text (a name of undecodable bytes comes back from the OS with surrogate escapes)."""
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _escaped(path: str) -> str:
    """A path of undecodable bytes as text a row can hold: each such byte as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


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
                if folder == root:
                    raise InputError(f"--input {root}: cannot list it ({e.strerror or e})") from e
                logger.warning("cannot list %s: %s", folder, e)
                out.append((folder, UNLISTABLE, -1))  # a row, not a gap
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
    # a name the OS gave back with surrogate escapes cannot be written to a row: escaped, and never read
    return sorted((p, size, t) if _utf8(p) else (_escaped(p), UNDECODABLE, -1) for p, size, t in out)


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
