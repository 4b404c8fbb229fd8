"""The ``doc_id`` strings the driver keeps from ``pages/``, stored compactly.

The documents table names each input's ``doc_id``; at 10M inputs the strings alone are most of a
gigabyte. The job writes a sha256 as 64 lowercase hex characters: such a value is kept as its 32
raw bytes in fixed blocks (half the size, no offsets); any other value (a caller's own rows) is kept
as a string. Each stored value has a position: ``>= 0`` in the hex blocks, ``<= -2`` among the
strings (``-2 - k``), and ``-1`` means none. Values are decoded back exactly. Pure: pyarrow and numpy.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BLOCK = 1 << 20  #: hex values per block (32 MiB): blocks are filled in turn, never copied to grow
_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
_NIBBLE = np.full(256, 255, np.uint8)  # a character's value as a lowercase hex digit (255: not one)
_NIBBLE[_DIGITS] = np.arange(16, dtype=np.uint8)


class DocIds:
    """An append-only store of doc_id values; :meth:`add` a dictionary, :meth:`take` positions."""

    def __init__(self):
        self._blocks: list[np.ndarray] = []  # (BLOCK, 32) uint8
        self.n_hex = 0
        self._strings: list[pa.Array] = []
        self.n_str = 0

    def add(self, dic: pa.Array) -> np.ndarray:
        """Positions of a string dictionary's values (int64), with one more entry, -1, for a null
        index; null and empty values are -1."""
        dic = dic if dic.type == pa.string() else pc.cast(dic, pa.string())
        lens = pc.fill_null(pc.binary_length(dic), 0).to_numpy(zero_copy_only=False)
        pos = np.full(len(dic) + 1, -1, np.int64)
        cand = np.flatnonzero(lens == 64)
        hexed = np.zeros(len(dic), bool)
        if len(cand):
            sub = dic.take(pa.array(cand, pa.int64()))  # a fresh array: its values are contiguous
            offs = np.frombuffer(sub.buffers()[1], np.int32, len(sub) + 1, sub.offset * 4)
            chars = np.frombuffer(sub.buffers()[2], np.uint8, offs[-1] - offs[0], offs[0]).reshape(-1, 64)
            nib = _NIBBLE[chars]
            good = (nib != 255).all(axis=1)
            packed = (nib[good, 0::2] << 4) | nib[good, 1::2]
            pos[cand[good]] = self._append_hex(packed)
            hexed[cand[good]] = True
            del sub, chars, nib, packed
        rest = np.flatnonzero(~hexed & (lens > 0))
        if len(rest):
            self._strings.append(dic.take(pa.array(rest, pa.int64())))
            pos[rest] = -2 - (self.n_str + np.arange(len(rest)))
            self.n_str += len(rest)
        return pos

    def _append_hex(self, packed: np.ndarray) -> np.ndarray:
        start, k, done = self.n_hex, len(packed), 0
        while done < k:
            if self.n_hex % BLOCK == 0 and self.n_hex // BLOCK == len(self._blocks):
                self._blocks.append(np.empty((BLOCK, 32), np.uint8))
            at = self.n_hex % BLOCK
            m = min(k - done, BLOCK - at)
            self._blocks[self.n_hex // BLOCK][at:at + m] = packed[done:done + m]
            done += m
            self.n_hex += m
        return start + np.arange(k, dtype=np.int64)

    def take(self, pos: np.ndarray) -> pa.Array:
        """The values at ``pos`` as a string array (null where ``pos`` is -1)."""
        pos = np.asarray(pos, np.int64)
        m = len(pos)
        is_hex = pos >= 0
        raw = np.zeros((m, 32), np.uint8)
        hp = pos[is_hex]
        if len(hp):
            raw[is_hex] = self._raw(hp, 32)
        chars = np.empty((m, 64), np.uint8)
        chars[:, 0::2] = _DIGITS[raw >> 4]
        chars[:, 1::2] = _DIGITS[raw & 15]
        del raw
        hexes = pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(np.arange(0, 64 * m + 1, 64, np.int32)),
                                                       pa.py_buffer(chars)])
        is_str = pos <= -2
        if self.n_str and is_str.any():
            strings = pa.chunked_array(self._strings, pa.string()).take(
                pa.array(np.where(is_str, -2 - pos, 0), mask=~is_str)).combine_chunks()
        else:
            strings = pa.nulls(m, pa.string())
        return pc.if_else(pa.array(is_hex), hexes, strings)

    def _raw(self, hp: np.ndarray, width: int) -> np.ndarray:
        """The first ``width`` raw bytes of the hex values at positions ``hp`` (all >= 0)."""
        got = np.empty((len(hp), width), np.uint8)
        blk = hp // BLOCK
        for b in np.unique(blk).tolist():
            sel = blk == b
            got[sel] = self._blocks[b][hp[sel] % BLOCK, :width]
        return got

    def fingerprint(self, pos: np.ndarray) -> np.ndarray:
        """A key per position that is equal exactly when the values are (positions are per stored
        occurrence, so two rows of one doc_id may have different positions): int64 >= 0, and -1 where
        ``pos`` is -1. A hex value's key is its first 63 bits (a sha256 prefix); a string's, a hash."""
        pos = np.asarray(pos, np.int64)
        out = np.full(len(pos), -1, np.int64)
        is_hex = pos >= 0
        hp = pos[is_hex]
        if len(hp):
            out[is_hex] = (self._raw(hp, 8).view(">u8").ravel() >> np.uint64(1)).astype(np.int64)
        is_str = pos <= -2
        if is_str.any():
            import hashlib

            uniq, inv = np.unique(pos[is_str], return_inverse=True)
            vals = pa.chunked_array(self._strings, pa.string()).take(pa.array(-2 - uniq)).to_pylist()
            keys = np.array([int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "big") >> 1
                             for v in vals], np.int64)
            out[is_str] = keys[inv]
        return out

    @property
    def nbytes(self) -> int:
        return len(self._blocks) * BLOCK * 32 + sum(s.nbytes for s in self._strings)
