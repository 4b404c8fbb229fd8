"""The shape of one packed training sample and THE ancestor-visibility rule (pure Python, no torch).

A packed sample is ``[M | Y_1 | ... | Y_N]``: ``M`` is the prefix (prompt with the image expanded,
then the layout stream) and ``Y_k`` is content branch k (branch-start token, content, EOS). Branch k
forked from the layout stream after ``f_k`` prefix tokens, so in serving it was generated from the
linear sequence ``M[:f_k] + Y_k``. Training must reproduce exactly that view:

* a prefix token ``i`` sees prefix tokens ``0..i`` (ordinary causal attention);
* a token of ``Y_k`` sees ``M[:f_k]`` and the tokens of ``Y_k`` up to itself; never a sibling
  branch and never prefix tokens at or after its fork.

:meth:`TreeLayout.visible` is the one definition of that rule; the dense mask, the flex-attention
``mask_mod`` and the tree-varlen gather (``padoc_ray.trainer.attention``) all derive from it or
from the per-token arrays below, and the tests check them against it. This module knows nothing of
tokens, labels, images or kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

PREFIX = -1  # branch id of prefix tokens in :meth:`TreeLayout.token_branch`


def _check_int(name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name} must be an int, got bool {v!r}")
    if not isinstance(v, int):
        try:  # numpy / torch integer scalars are accepted through __index__
            v = v.__index__()
        except (AttributeError, TypeError):
            raise ValueError(f"{name} must be an int, got {type(v).__name__} {v!r}") from None
    if v < lo or (hi is not None and v > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} = {v} is out of range: it must be {bound}")
    return v


@dataclass(frozen=True)
class TreeLayout:
    """Lengths and forks of one packed sample ``[M | Y_1 .. Y_N]``.

    ``prefix_len``: |M|, the prompt (image expanded) plus the layout stream.
    ``forks``: f_k in [0, prefix_len]; branch k sees ``M[:f_k]``.
    ``branch_lens``: |Y_k| >= 1, in packed order.
    Lists are accepted and stored as tuples; bad values raise ``ValueError`` naming the field.
    """

    prefix_len: int
    forks: tuple[int, ...] = ()
    branch_lens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        p = _check_int("prefix_len", self.prefix_len, 0)
        try:
            forks = tuple(self.forks)
            lens = tuple(self.branch_lens)
        except TypeError:
            raise ValueError("forks and branch_lens must be sequences of ints") from None
        if len(forks) != len(lens):
            raise ValueError(f"forks has {len(forks)} entries but branch_lens has {len(lens)}: "
                             "one fork per branch")
        forks = tuple(_check_int(f"forks[{i}]", f, 0, p) for i, f in enumerate(forks))
        lens = tuple(_check_int(f"branch_lens[{i}]", n, 1) for i, n in enumerate(lens))
        if p + sum(lens) == 0:
            raise ValueError("empty layout: prefix_len is 0 and there are no branches")
        object.__setattr__(self, "prefix_len", p)
        object.__setattr__(self, "forks", forks)
        object.__setattr__(self, "branch_lens", lens)

    # ---- sizes and offsets ----------------------------------------------------------------------
    @property
    def num_branches(self) -> int:
        return len(self.branch_lens)

    def total_len(self) -> int:
        """S = |M| + sum |Y_k|."""
        return self.prefix_len + sum(self.branch_lens)

    def branch_starts(self) -> tuple[int, ...]:
        """Packed offset of the first token of each ``Y_k``."""
        return self._starts

    @cached_property
    def _starts(self) -> tuple[int, ...]:
        out, s = [], self.prefix_len
        for n in self.branch_lens:
            out.append(s)
            s += n
        return tuple(out)

    # ---- per-token views (what kernels vectorize) ---------------------------------------------
    def token_branch(self) -> list[int]:
        """Branch index of each packed token; :data:`PREFIX` (-1) for prefix tokens."""
        out = [PREFIX] * self.prefix_len
        for b, n in enumerate(self.branch_lens):
            out.extend([b] * n)
        return out

    def token_fork(self) -> list[int]:
        """For each packed token, how many prefix tokens it may see: its fork for branch tokens,
        ``i + 1`` for prefix token ``i``."""
        out = list(range(1, self.prefix_len + 1))
        for f, n in zip(self.forks, self.branch_lens):
            out.extend([f] * n)
        return out

    def linear_positions(self) -> list[int]:
        """1-D position of each packed token in its own linear sequence: prefix token ``i`` -> i,
        token ``j`` of ``Y_k`` -> ``f_k + j`` (its position in ``M[:f_k] + Y_k``)."""
        out = list(range(self.prefix_len))
        for f, n in zip(self.forks, self.branch_lens):
            out.extend(range(f, f + n))
        return out

    def linear_indices(self, branch: int) -> list[int]:
        """Packed indices of the linear sequence ``M[:f_k] + Y_k`` of branch ``branch``, in order."""
        b = _check_int("branch", branch, 0, self.num_branches - 1)
        s = self._starts[b]
        return [*range(self.forks[b]), *range(s, s + self.branch_lens[b])]

    # ---- THE visibility rule --------------------------------------------------------------------
    def visible(self, q: int, k: int) -> bool:
        """Whether packed token ``q`` (query) attends to packed token ``k`` (key)."""
        n = self.total_len()
        q = _check_int("q", q, 0, n - 1)
        k = _check_int("k", k, 0, n - 1)
        if k > q:
            return False  # causal everywhere: nothing sees a later packed token
        p = self.prefix_len
        if q < p:
            return True  # prefix: plain causal
        b = self._branch_of(q)
        if k < p:
            return k < self.forks[b]  # the prefix up to the fork only
        return k >= self._starts[b]  # own branch only, never a sibling

    def _branch_of(self, t: int) -> int:
        # binary search over branch starts (t >= prefix_len)
        lo, hi = 0, self.num_branches - 1
        starts = self._starts
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= t:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def visible_pairs(self) -> int:
        """Number of (query, key) pairs attended: |M|(|M|+1)/2 + sum_k |Y_k| (f_k + (|Y_k|+1)/2)."""
        p = self.prefix_len
        return p * (p + 1) // 2 + sum(n * f + n * (n + 1) // 2 for f, n in zip(self.forks, self.branch_lens))
