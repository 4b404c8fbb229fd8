"""Where :class:`padoc_ray.serve.jobs.JobStore` keeps its bytes: a private local folder or an s3:// prefix.

Both take keys relative to the store's root (``jobs/<id>/job.json``) and count every storage
operation in ``ops`` (by kind), so that a test can tell what a sweep costs. A local folder is made
private: folders 0700 (the root's parents too, where this creates them), files 0600, written
atomically (a temporary file, then a rename); an existing root not owned by this uid, or open to
its group or others, is refused. Only a local folder may hold the store's signing key (``store.key``,
:meth:`LocalBackend.key`); an s3:// store's key never sits in its prefix (see
:func:`padoc_ray.serve.jobs.signing_key`). No ray, no fastapi.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import uuid
from collections import Counter

from padoc_ray.storage import StorageConfig, s3_client, split_s3

KEY_NAME = "store.key"
KEY_BYTES = 32


def _makedirs_private(path: str) -> None:
    """``os.makedirs`` with every folder it creates 0700 (``makedirs``' mode reaches only the last one)."""
    missing = []
    p = path
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # whatever the umask


def private_mode_error(path: str, st: os.stat_result) -> str | None:
    """Why an existing store root may not be used, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return f"the job store {path} is not a folder"
    if st.st_uid != os.getuid():
        return (f"the job store {path} is owned by uid {st.st_uid}, not by this process's uid {os.getuid()}: "
                "another user could read its inputs or plant jobs; choose a folder of your own")
    if st.st_mode & 0o077:
        return (f"the job store {path} is open to its group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                f"run chmod 700 {path}, or choose another folder")
    return None


class LocalBackend:
    def __init__(self, root: str, ops: Counter):
        self.root, self.ops = root, ops
        if os.path.lexists(root):
            why = private_mode_error(root, os.stat(root))
            if why:
                raise ValueError(why)
        else:
            _makedirs_private(root)

    def _p(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def key(self) -> bytes:
        """``<root>/store.key``: 32 random bytes, created by whichever process comes first. Beside
        ``jobs/``, not in it: the root is this uid's alone (0700, checked at start), so whoever could
        write a job could read a key kept anywhere else of this uid's too."""
        path = self._p(KEY_NAME)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            with open(path, "rb") as f:
                key = f.read()
        else:
            key = secrets.token_bytes(KEY_BYTES)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
        if len(key) != KEY_BYTES:  # a writer is still at it, or the file is damaged
            raise ValueError(f"the job store's key {path} is not {KEY_BYTES} bytes; remove it to start afresh")
        return key

    def read(self, key: str) -> bytes | None:
        self.ops["read"] += 1
        try:
            with open(self._p(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(self, key: str, data: bytes) -> None:
        self.ops["write"] += 1
        path = self._p(key)
        _makedirs_private(os.path.dirname(path))
        tmp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"  # unique: two writers never share a temporary file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def exists(self, key: str) -> bool:
        self.ops["exists"] += 1
        return os.path.exists(self._p(key))

    def list(self, prefix: str) -> list[str]:
        """The names right below the folder ``prefix`` (temporary files left out)."""
        self.ops["list"] += 1
        try:
            return [n for n in os.listdir(self._p(prefix)) if not n.endswith(".tmp")]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete(self, key: str) -> None:
        self.ops["delete"] += 1
        try:
            os.remove(self._p(key))
        except FileNotFoundError:
            pass

    def delete_tree(self, prefix: str) -> None:
        self.ops["delete"] += 1
        shutil.rmtree(self._p(prefix), ignore_errors=True)


class S3Backend:
    def __init__(self, root: str, storage: StorageConfig, ops: Counter):
        self.bucket, self.prefix = split_s3(root)
        self.prefix = self.prefix.strip("/")
        self.client, self.ops = s3_client(storage), ops

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def read(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        self.ops["read"] += 1
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def write(self, key: str, data: bytes) -> None:
        self.ops["write"] += 1
        self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        self.ops["exists"] += 1
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._k(key))
            return True
        except ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise

    def _pages(self, prefix: str, delimiter: str | None):
        kw = {"Bucket": self.bucket, "Prefix": self._k(prefix).rstrip("/") + "/"}
        if delimiter:
            kw["Delimiter"] = delimiter
        for page in self.client.get_paginator("list_objects_v2").paginate(**kw):
            self.ops["list"] += 1
            yield kw["Prefix"], page

    def list(self, prefix: str) -> list[str]:
        out = []
        for base, page in self._pages(prefix, "/"):
            out += [o["Key"][len(base):] for o in page.get("Contents", [])]
            out += [p["Prefix"][len(base):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return [n for n in out if n]

    def delete(self, key: str) -> None:
        self.ops["delete"] += 1
        self.client.delete_object(Bucket=self.bucket, Key=self._k(key))

    def delete_tree(self, prefix: str) -> None:
        for _, page in self._pages(prefix, None):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.ops["delete"] += 1
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
