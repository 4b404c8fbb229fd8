"""What a process that multiprocessing spawned saw while it prepared (imported this module, the
target's own) and when its target ran: tests/unit/engine/test_startup_gc.py."""

import gc
import os
import sys
import weakref


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


#: the collector's state while the spawned process imported its target's module
IMPORTED_WITH_GC = gc.isenabled()
#: made while the process prepared: a cycle that lives on, and one that is garbage as soon as it is made
KEPT = Cycle()
_GARBAGE = weakref.ref(Cycle())


def report(queue) -> None:
    from padoc_ray.engine.vllm_engine import SPAWN_BOOT, SPAWN_BOOT_PARENT

    queue.put({"imported_with_gc": IMPORTED_WITH_GC, "gc_at_target": gc.isenabled(),
               "pythonpath": os.environ.get("PYTHONPATH"), "parent_var": os.environ.get(SPAWN_BOOT_PARENT),
               "boot_on_sys_path": any(os.path.abspath(p or ".") == SPAWN_BOOT for p in sys.path),
               # the preparation's garbage was collected, and what it left alive was frozen, by the time the target ran
               "preparation_garbage_collected": _GARBAGE() is None,
               "kept_frozen": gc.get_freeze_count() > 0 and not any(o is KEPT for o in gc.get_objects())})
