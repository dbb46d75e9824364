"""The SQS front's state: its durable queue records (registry.Registry), the library queues
it reads and writes through the service (the same AckQueue objects the native API and
Sasquatch's use), the connection holding its deliveries per queue, and its receipt handles.

Deliveries through SQS belong to no client lease: they come back at their visibility
deadline, as SQS's do (a session with no lease, as Sasquatch's API does)."""
import time
from dataclasses import dataclass, field

from ..backend import ClientConn, Session
from .errors import SqsError
from .queueattrs import DEFAULTS, FIFO_DEFAULTS, arn, check_name, is_fifo, redrive_of
from .registry import Registry

__all__ = ["SqsFront", "Call"]


@dataclass
class Call:
    """One SQS request: its action, JSON parameters, who sent it, where it came to."""
    action: str
    params: dict
    base_url: str              # scheme://host[:port] the client addressed
    region: str
    client: object = None      # the auth.Client that signed it (None without --auth)
    key_id: str = None
    request: object = None     # the aiohttp request (a long poll watches its transport)
    extra: dict = field(default_factory=dict)

    def url(self, name):
        from .queueattrs import ACCOUNT
        return f"{self.base_url}/{ACCOUNT}/{name}"

    def arn(self, name):
        return arn(name, self.region)


class SqsFront:
    def __init__(self, api, clock=time.time):
        self.api = api
        self.service = api.service
        self.clock = clock
        self.registry = Registry(self.service.db, clock)
        self.session = Session("sqs", 0.0)
        self.conns = {}            # queue name -> ClientConn holding SQS deliveries
        self.expiry = {}           # receipt -> clock time its delivery is given back
        self.swept = clock()
        self.tasks = {}            # source ARN -> its message move tasks (newest first)
        self.fifo = {}             # FIFO queue name -> fifo.FifoState

    async def run(self, fn, *args):
        return await self.api.run(fn, *args)

    # -- which queues exist ------------------------------------------------------------------

    def _stored(self):
        return set(self.service.list_queues())

    async def record(self, name, *, must_exist=True):
        """name's record (made for a queue the other fronts created); QueueDoesNotExist
        when there is none (and must_exist), else None."""
        rec = self.registry.cache.get(name) if self.registry.cache is not None else None
        if rec is None:
            await self.run(self.registry.load)
            rec = self.registry.cache.get(name)
        if rec is not None and not rec.get("deleted"):
            return rec
        if rec is None and (name in self.service.queues or name in await self.run(
                self._stored)):
            if check_name_quiet(name):
                return await self.run(self.registry.put, name, self.new_record(name, {}))
        if must_exist:
            raise SqsError("QueueDoesNotExist",
                           "The specified queue does not exist.")
        return None

    def new_record(self, name, attributes):
        base = dict(DEFAULTS, **(FIFO_DEFAULTS if is_fifo(name) else {}))
        base.update(attributes)
        return {"attributes": base, "tags": {}, "created": self.clock(), "deleted": False}

    async def names(self):
        """Every queue SQS lists: recorded and not deleted, or stored by another front."""
        await self.run(self.registry.load)
        recs = self.registry.cache
        names = {n for n, r in recs.items() if not r.get("deleted")}
        names |= {n for n in await self.run(self._stored)
                  if n not in recs and check_name_quiet(n)}
        return sorted(names)

    def recorded(self, name):
        """Whether name is a queue SQS has a live record of (after record() loaded them)."""
        rec = (self.registry.cache or {}).get(name)
        return rec is not None and not rec.get("deleted")

    # -- the library's queues ------------------------------------------------------------------

    async def queue(self, name):
        """(AckQueue, ClientConn) of queue name (opened on first use, its ready listener
        waking long polls)."""
        q = await self.api.queue(name)
        cc = self.conns.get(name)
        if cc is None:
            conn = await self.run(lambda: q.connect(thread_bound=False))
            cc = self.conns.setdefault(name, ClientConn(q, conn))
        return q, cc

    def fifo_state(self, name):
        from .fifo import FifoState
        st = self.fifo.get(name)
        if st is None:
            st = self.fifo[name] = FifoState(self.clock)
        return st

    async def counts(self, name, q):
        """The queue's counts as SQS sees them (FIFO: staged messages are visible)."""
        counts = dict(await self.run(q.counts))
        if name in self.fifo:
            pending, _ = await self.run(self.fifo[name].staged)
            counts["ready"] = counts.get("ready", 0) + pending
            counts["in_flight"] = max(0, counts.get("in_flight", 0) - pending)
        return counts

    async def purged(self, name, q):
        await self.run(q.purge)
        if name in self.fifo:
            self.fifo[name].reset()

    def policy(self, q, rec):
        count, dlq = redrive_of(rec["attributes"])
        if count is None:
            return None
        # SQS accepts a redrive policy that names the queue itself, which AckQueue's own
        # dead_letter= refuses: receive_policy takes it when told so.
        return q.receive_policy(count, dlq, to_itself=True)

    # -- receipts ----------------------------------------------------------------------------

    def remember(self, receipts, seconds):
        """When receipts' deliveries are given back; receipts of deliveries given back over
        a minute ago are forgotten (swept at most every 10 s), so that the receipt map does
        not grow with messages never deleted."""
        now = self.clock()
        for r in receipts:
            self.expiry[r] = now + seconds
        if now - self.swept < 10:
            return
        self.swept = now
        gone = [r for r, t in self.expiry.items()
                if t < now - 60 or r not in self.service.receipts]
        for r in gone:
            del self.expiry[r]
        self.service.forget(gone)

    def held_elsewhere(self, name, receipt):
        """Whether receipt names a delivery held for a queue other than name (through any
        front, or out of another FIFO queue's staging): such a receipt is refused with
        ReceiptHandleIsInvalid, never acted upon."""
        d = self.service.receipts.get(receipt)
        if d is not None and d.queue != name:
            return True
        return any(other != name and st.holds(receipt) for other, st in self.fifo.items())

    def delivery(self, name, receipt):
        d = self.service.receipts.get(receipt)
        if d is None or d.session is not self.session or d.queue != name:
            return None
        return d

    async def close(self, app):
        for cc in list(self.conns.values()):
            await self.run(cc.close)
        self.conns.clear()
        await self.run(self.registry.close)


def check_name_quiet(name):
    try:
        check_name(name)
        return True
    except SqsError:
        return False
