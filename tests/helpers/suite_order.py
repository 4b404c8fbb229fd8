"""The order in which `make test` hands test files to its workers: the files that start engines,
clusters and CLIs first, the quick ones last.

`make test` runs ``pytest -n 2 --dist loadfile --no-loadscope-reorder``: each file goes whole to one
worker, in the order of the collection. pytest-xdist's own reordering (most tests first) put the
files with few but long tests (a 200 s script check, the batch-job files, the multi-node cluster) at
the end, where one worker ran them for minutes while the other had nothing left to do. Here a file
weighs its tests marked ``engine`` or ``slow`` by hand (what costs minutes; tests/conftest.py orders the
files before it gives each test its tier's marker); heavier files go first, ties and unmarked files
keep the collection order, and the quick files at the end fill the gaps."""

from __future__ import annotations

from collections import Counter

HEAVY_MARKS = ("engine", "slow")  #: marks of tests that start an engine, a cluster or a long CLI run


def heavy(item) -> bool:
    """Whether ``item`` carries one of :data:`HEAVY_MARKS`."""
    return any(item.get_closest_marker(m) is not None for m in HEAVY_MARKS)


def by_weight(items: list) -> list:
    """``items`` with whole files ordered by their number of heavy tests, most first (a stable sort:
    the tests of a file keep their order, files of equal weight keep theirs)."""
    weight = Counter(item.nodeid.split("::", 1)[0] for item in items if heavy(item))
    return sorted(items, key=lambda item: -weight[item.nodeid.split("::", 1)[0]])

