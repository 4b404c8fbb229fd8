"""The engine side of the online service: the Serve deployment that hosts one engine, and the
adapter through which the document runner calls it.

* :class:`EngineReplica` hosts one :class:`~padoc_ray.host.PageHost` and only runs pages: a page
  row in, the finished row out. Its engine runs under vLLM's priority scheduling policy, so
  interactive pages (priority 0) run ahead of job pages (priority 1).
* :class:`RayEngine` is the :class:`~padoc_ray.serve.runner.EngineClient` over the replica's
  deployment handle: Serve's backpressure becomes :class:`~padoc_ray.serve.runner.EngineBusy`, and
  leaving (a client gone, a deadline, a cancelled job) cancels the page's engine work. A page whose
  region events are wanted (``stream=regions``) is a streaming call (``handle.options(stream=True)``)
  of :meth:`EngineReplica.stream_page`, with the same backpressure and cancellation.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncIterator

from padoc_ray.serve.config import ServeConfig
from padoc_ray.serve.runner import EngineBusy


class EngineReplica:
    """One PageHost: pages in, rows out. Builds its engine in the replica's event loop."""

    async def __init__(self, cfg: ServeConfig):
        from padoc_ray.host import PageHost

        host = dataclasses.replace(cfg.host, engine_overrides={"scheduling_policy": "priority",
                                                               **cfg.host.engine_overrides})
        self.host = await PageHost.from_config(cfg.model, host, cfg.storage, cfg.replay_gt)

    async def parse_page(self, row: dict, image: bytes, tenant: str, salt: str, priority: int = 0) -> dict:
        from padoc_ray.host import parse_row

        return await parse_row(self.host, row, image, tenant=tenant, salt=salt, priority=priority)

    async def stream_page(self, row: dict, image: bytes, tenant: str, salt: str,
                          priority: int = 0) -> AsyncIterator[dict]:
        """The page's region events as they happen, then ``{"event": "row", "row": ...}``
        (:func:`padoc_ray.host.stream_row`); a cancelled call cancels the page."""
        from padoc_ray.host import stream_row

        async for ev in stream_row(self.host, row, image, tenant=tenant, salt=salt, priority=priority):
            yield ev

    async def ready(self, timeout_s: float = 30.0) -> dict:
        """The host's stats once its engine answered a one-token probe within ``timeout_s``."""
        await self.host.probe(timeout_s=timeout_s)
        return self.host.stats()

    async def describe(self) -> dict:
        """What the ingress tells clients about the served checkpoint, and checks requests against:
        its family, the decoding modes it has, the default mode, and for each mode it lacks why."""
        return model_info(self.host.model_protocol, self.host.cfg.mode)

    async def stats(self) -> dict:
        return self.host.stats()

    async def check_health(self) -> None:
        """Serve replaces a replica whose check raises, killing its process outright: an engine found dead
        is shut down first (its core ended if it still runs, its temp folder removed)."""
        if self.host.dead is not None:
            self.host.shutdown_dead_engine()
            raise RuntimeError(f"engine died: {self.host.dead}")

    def __del__(self):
        host = getattr(self, "host", None)
        if host is not None:
            host.shutdown()


def model_info(model_protocol, default_mode: str) -> dict:
    """``{"family", "modes", "default_mode", "refused": {mode: why}}`` of a started host's checkpoint
    (hpd: fork only, with the family's reason for refusing sequential)."""
    from padoc_ray.protocol.family import check_mode
    from padoc_ray.scheduler.state import DECODE_MODES

    family = getattr(model_protocol, "family", "padoc")
    modes = tuple(getattr(model_protocol, "modes", DECODE_MODES))
    refused = {}
    for m in DECODE_MODES:
        if m not in modes:
            try:
                check_mode(family, m)
                why = f"the {family} checkpoint has no mode {m}"
            except ValueError as e:
                why = str(e)
            # the family's reason speaks of the command-line flag; a request names the mode as a field
            refused[m] = why.replace("--mode ", "mode ")
    return {"family": family, "modes": list(modes), "default_mode": default_mode, "refused": refused}


def mode_refusal(info: dict | None, mode: str):
    """The :class:`~padoc_ray.serve.errors.Refusal` (``unsupported_mode``) of a request for a decoding
    mode the served checkpoint lacks (``info``: :func:`model_info`; None: unknown, no check)."""
    from padoc_ray import status
    from padoc_ray.serve.errors import Refusal

    if info is None or mode in info["modes"]:
        return None
    why = info.get("refused", {}).get(mode) or f"the served checkpoint has no mode {mode}"
    return Refusal(status.UNSUPPORTED_MODE, f"{why} (this service's modes: {', '.join(info['modes'])})")


class RayEngine:
    """:class:`~padoc_ray.serve.runner.EngineClient` over an :class:`EngineReplica` deployment handle."""

    def __init__(self, handle):
        self.handle = handle
        self.streaming = handle.options(stream=True)

    async def parse_page(self, row: dict, image: bytes, *, tenant: str, salt: str, priority: int) -> dict:
        from ray.serve.exceptions import BackPressureError, RequestCancelledError

        resp = self.handle.parse_page.remote(row, image, tenant, salt, priority)
        try:
            return await resp
        except BackPressureError:
            raise EngineBusy() from None
        except (asyncio.CancelledError, RequestCancelledError):
            resp.cancel()  # our own cancellation does not reach the replica by itself
            raise asyncio.CancelledError from None

    async def stream_page(self, row: dict, image: bytes, *, tenant: str, salt: str,
                          priority: int) -> AsyncIterator[dict]:
        """The replica's events of the page (:meth:`EngineReplica.stream_page`). Leaving before the
        last one (cancelled, or closed early) cancels the call, so the replica cancels the page."""
        from ray.serve.exceptions import BackPressureError, RequestCancelledError

        gen = self.streaming.stream_page.remote(row, image, tenant, salt, priority)
        finished = False
        try:
            async for ev in gen:
                yield ev
            finished = True
        except BackPressureError:
            finished = True
            raise EngineBusy() from None
        except RequestCancelledError:
            raise asyncio.CancelledError from None
        finally:
            if not finished:
                gen.cancel()  # our own cancellation does not reach the replica by itself

    async def describe(self) -> dict:
        """The served checkpoint's :func:`model_info` (raises EngineBusy when every replica is loaded)."""
        from ray.serve.exceptions import BackPressureError

        try:
            return await self.handle.describe.remote()
        except BackPressureError:
            raise EngineBusy() from None

    async def ready(self, timeout_s: float = 30.0) -> dict:
        """The replica's stats once its engine answers a probe within ``timeout_s`` (raises EngineBusy
        when loaded)."""
        from ray.serve.exceptions import BackPressureError

        try:
            return await self.handle.ready.remote(timeout_s)
        except BackPressureError:
            raise EngineBusy() from None
