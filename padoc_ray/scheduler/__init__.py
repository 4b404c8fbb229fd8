"""The layout-fork scheduler: pure per-page decisions (``state``), the async page runner over the
engine interface (``runner``), and teacher-forced replay (``replay``)."""

from .replay import replay_input
from .runner import EventSink, PageInput, PageRecord, RegionEvent, run_page
from .state import ForkAction, PageState, PageStatus, SchedulerConfig

__all__ = ["replay_input", "PageInput", "PageRecord", "RegionEvent", "EventSink", "run_page", "ForkAction",
           "PageState", "PageStatus", "SchedulerConfig"]
