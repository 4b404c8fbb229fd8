"""tests/helpers/tiers.py: what the fast tiers' guard refuses (and what it lets run), each test's tier
from its folder, and the seconds per tier printed at the end of a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import BIN, ROOT
from tests.helpers.tiers import Guard, TierViolation, _guarded, starts, tier_of, tier_totals

PY = sys.executable


@pytest.mark.parametrize("argv, belongs", [
    ([f"{BIN}/ray", "start", "--head", "--port=0"], "cluster"),
    (["/x/ray/core/src/ray/gcs/gcs_server", "--gcs_server_port=1"], "cluster"),
    (["/x/raylet", "--node_ip_address=127.0.0.1"], "cluster"),
    ([f"{BIN}/padoc-ray", "parse", "--input", "in", "--output", "out", "--model", "m"], "cluster"),
    ([f"{BIN}/padoc-ray", "-v", "serve", "--model", "m"], "cluster"),
    ([PY, "-m", "padoc_ray.cli", "demo", "--model", "m"], "engine"),
    ([PY, "-m", "padoc_ray.cli", "parse-page", "a.pdf"], "engine"),
    ([PY, "-m", "padoc_ray.cli", "bench", "steps", "--model", "m"], "engine"),
    ([PY, "-m", "padoc_ray.cli", "bench", "soak"], "cluster"),
    ([PY, "-m", "padoc_ray.cli", "doctor", "--start"], "engine"),
    (["/bin/sh", "-c", f"{BIN}/padoc-ray train --model m --gt g --images i --out o"], "cluster"),
    ([PY, os.path.join(ROOT, "jobs", "batch_parse.py"), "--input", "in"], "cluster"),
    ([PY, "-m", "moto.server", "-p", "1"], "cluster"),
    (["/usr/bin/chromium", "--headless"], "cluster"),
    (["/x/node", "/x/playwright/cli.js", "run-driver"], "cluster"),
    # what the fast tiers may run
    ([f"{BIN}/padoc-ray", "parse", "--help"], None),
    ([PY, "-m", "padoc_ray.cli", "doctor"], None),
    ([PY, "-m", "padoc_ray.cli", "bench", "raster", "--input", "in"], None),
    ([PY, "-m", "padoc_ray.cli", "reannotate", "--compare", "m=out"], None),
    ([PY, "-c", "import ray; print('ray start')"], None),
    (["sleep", "60"], None),
])
def test_the_guard_knows_what_a_child_process_starts(argv, belongs):
    found = starts(argv)
    assert (found and found[1]) == belongs, found


def test_the_guard_refuses_ray_an_engine_and_their_servers_and_undoes_itself():
    import ray

    from padoc_ray.engine.vllm_engine import VllmEngine

    patched = (subprocess.Popen._execute_child, ray.init, VllmEngine.__init__)
    guard = Guard("unit")
    with guard.active():
        with pytest.raises(TierViolation, match=r"^unit tier: this test starts a Ray cluster \(`ray start`\); "
                                                r"move it to tests/cluster/"):
            subprocess.run(["/nonexistent/bin/ray", "start", "--head"], check=False)  # refused before it runs
        with pytest.raises(TierViolation, match=r"starts Ray \(ray.init\); move it to tests/cluster/"):
            ray.init(address="local")
        with pytest.raises(TierViolation, match=r"starts a vLLM engine \(VllmEngine\); move it to tests/engine/"):
            VllmEngine(None)
        assert subprocess.run([PY, "-c", "print('ok')"], capture_output=True, text=True).stdout == "ok\n"
    assert len(guard.violations) == 3 and not ray.is_initialized()
    assert (subprocess.Popen._execute_child, ray.init, VllmEngine.__init__) == patched


def test_a_fast_tier_phase_fails_even_where_its_code_catches_the_violation():
    """The wrapper around each phase (setup, call, teardown): a caught TierViolation still fails it; the
    engine and cluster tiers run before."""
    from padoc_ray.engine.vllm_engine import VllmEngine

    before = subprocess.Popen._execute_child
    phase = _guarded(SimpleNamespace(path=Path(ROOT, "tests", "unit", "x", "test_a.py")))
    next(phase)  # the phase runs
    assert subprocess.Popen._execute_child is not before
    try:
        VllmEngine(None)
    except TierViolation:
        pass
    with pytest.raises(pytest.fail.Exception, match=r"^unit tier: this test starts a vLLM engine .* caught"):
        phase.send("its result")
    assert subprocess.Popen._execute_child is before
    phase = _guarded(SimpleNamespace(path=Path(ROOT, "tests", "cluster", "x", "test_a.py")))
    next(phase)
    assert subprocess.Popen._execute_child is before
    with pytest.raises(StopIteration) as stop:
        phase.send("its result")
    assert stop.value.value == "its result"


def test_each_folder_is_a_tier():
    tests = os.path.join(ROOT, "tests")
    assert [tier_of(os.path.join(tests, t, "x", "test_a.py")) for t in ("unit", "engine", "cluster", "contracts")] \
        == ["unit", "engine", "cluster", "contracts"]
    assert tier_of(os.path.join(tests, "helpers", "tiers.py")) is None and tier_of(os.path.join(ROOT, "x.py")) is None


def test_this_test_carries_its_tiers_marker(request):
    assert request.node.get_closest_marker("contracts") is not None
    assert request.node.get_closest_marker("unit") is None and request.node.get_closest_marker("engine") is None


def test_tier_totals_sum_setup_call_and_teardown_by_tier():
    def rep(nodeid, when, duration):
        return SimpleNamespace(nodeid=nodeid, when=when, duration=duration)

    reports = [rep("tests/unit/a/test_a.py::t", "setup", 1.0), rep("tests/unit/a/test_a.py::t", "call", 2.0),
               rep("tests/unit/a/test_a.py::t", "teardown", 0.5), rep("tests/unit/b/test_b.py::u", "call", 0.25),
               rep("tests/cluster/c/test_c.py::v[1]", "call", 10.0), SimpleNamespace(nodeid="tests/unit/x.py")]
    assert tier_totals(reports, Path(ROOT)) == {"unit": [3.75, 2], "cluster": [10.0, 1]}
