"""tests/helpers/suite_order.py: whole files, heaviest (most engine/slow tests) first, each file's tests and
equal files in their collection order."""

from __future__ import annotations

from types import SimpleNamespace

from tests.helpers.suite_order import by_weight


def _item(nodeid: str, *marks: str):
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: name if name in marks else None)


def test_heavy_files_go_first_whole_and_in_order():
    items = [_item("tests/test_a.py::one"), _item("tests/test_a.py::two"),
             _item("tests/test_b.py::one", "slow"),
             _item("tests/test_c.py::one", "engine"), _item("tests/test_c.py::two"),
             _item("tests/test_c.py::three", "engine", "slow"),
             _item("tests/test_d.py::one", "engine"), _item("tests/test_e.py::one")]
    assert [i.nodeid for i in by_weight(items)] == [
        "tests/test_c.py::one", "tests/test_c.py::two", "tests/test_c.py::three",  # two heavy tests
        "tests/test_b.py::one", "tests/test_d.py::one",  # one each: collection order
        "tests/test_a.py::one", "tests/test_a.py::two", "tests/test_e.py::one"]  # none: collection order

