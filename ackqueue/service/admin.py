"""The native API's admin endpoints: redrive a dead-letter queue, pack the storage.

``POST /v1/queues/{name}/redrive[?to=OTHER]`` moves the ready messages of queue name (a
dead-letter queue) back to the queue each came from, or to the queue OTHER, through the
library's ``AckQueue.redrive``; answers ``{"moved": n}``.

``POST /v1/pack[?keep_seconds=S]`` packs the service's storage (``ackqueue.maintenance``)
while the queues stay in use; answers the pack's report.  One pack at a time, as
``ackqueue server`` does: a request that comes while a pack is running waits for it and
gets its outcome (``"joined": true``; its own keep_seconds is not used) instead of
starting another.  Both need the admin right under ``--auth`` (auth.ROUTES).
"""
import asyncio

from aiohttp import web

from ackqueue import store

from . import params
from .backend import check_name
from .errors import ApiError

__all__ = ["add_routes", "Admin"]


def add_routes(app, api):
    admin = Admin(api)
    app.router.add_post("/v1/queues/{name}/redrive", admin.redrive)
    app.router.add_post("/v1/pack", admin.pack)


class Admin:
    def __init__(self, api):
        self.api = api
        self.packing = None           # the running pack's future, shared by its waiters

    async def redrive(self, request):
        name = params.queue_name(request)
        to = request.query.get("to")
        if to is not None:
            try:
                check_name(to)
            except ValueError as exc:
                raise ApiError(400, "InvalidRequest", f"to: {exc}") from None
            if to == name:
                raise ApiError(400, "ValidationError",
                               "to must name another queue than the one redriven")
            await self.api.queue(to)      # its long polls hear of the arrivals
        q = await self.api.queue(name)
        moved = await self.api.run(lambda: q.redrive(to=to))
        return web.json_response({"moved": moved})

    async def pack(self, request):
        keep = params.number(request, "keep_seconds", 0.0, hi=store.MAX_RETENTION)
        joined = self.packing is not None
        if not joined:
            self.packing = asyncio.ensure_future(self.api.run(self.api.service.pack, keep))
            self.packing.add_done_callback(self._packed)
        report = await asyncio.shield(self.packing)
        return web.json_response({"size_before": report.size_before,
                                  "size_after": report.size_after, "freed": report.freed,
                                  "seconds": report.seconds, "joined": joined})

    def _packed(self, future):
        self.packing = None
        if not future.cancelled():
            future.exception()        # retrieved: each waiter sees it (a 500, logged)
