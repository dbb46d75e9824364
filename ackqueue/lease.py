"""Process leases: how processes sharing a queue through a server learn that one died.

Each process that opens a storage through a server registers a lease (store.LeaseRecord)
and a thread advances its beat every third of the lease timeout.  Every process also watches
the others' beats: a lease whose beat has not moved for its timeout, measured on the
watcher's own monotonic clock (machines' clocks are never compared), is expired with one
commit that gives back every message its process held without a visibility deadline
(messages with a deadline come back at their deadline, through any process's reaper).

A process that was only paused past its lease finds its lease gone at its next beat: it
forgets the deliveries that were given back (a late ack of them raises StaleAck, and the
store would refuse it anyway), registers a new lease and goes on.

Each beat also sweeps this process's own orphans: deliveries the store records under its
lease that no thread here holds, which a claim whose outcome a lost connection hid leaves.
"""
import logging
import os
import socket
import threading
import time
import uuid
from time import monotonic

import transaction

from . import store
from .pack_rereads import read_fresh

__all__ = ["LeaseKeeper", "DEFAULT_LEASE_TIMEOUT"]

log = logging.getLogger(__name__)

DEFAULT_LEASE_TIMEOUT = 30.0


class LeaseKeeper:
    """This process's lease on one shared database, and the watch over everyone else's."""

    def __init__(self, database, timeout=DEFAULT_LEASE_TIMEOUT):
        if timeout <= 0:
            raise ValueError("lease_timeout must be a positive number of seconds")
        self.database = database
        self.timeout = float(timeout)
        self.expired_leases = 0           # leases of other processes this one expired
        self._seen = {}                   # other lease id -> (beat, monotonic() when seen)
        self._stop = threading.Event()
        self._tm = transaction.TransactionManager()
        self._conn = database.db.open(transaction_manager=self._tm)
        self.lease_id = None
        self._register()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="ackqueue-lease")
        self._thread.start()

    def _register(self):
        self.lease_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.database.committer.submit([store.RegisterLease(
            self.lease_id, self.timeout, os.getpid(), socket.gethostname(), time.time())]
        ).wait()

    def _run(self):
        while not self._stop.wait(self.timeout / 3):
            try:
                self.beat()
            except Exception:  # keep beating through a server outage
                log.warning("ackqueue: lease heartbeat failed", exc_info=True)

    def beat(self):
        """One heartbeat: advance our beat, judge the others', sweep our orphans."""
        try:
            self.database.committer.submit([store.Beat(self.lease_id)]).wait()
        except store.LeaseLost:
            self._lost()
        self._judge_others()
        for arbiter in self.database.shared_arbiters():
            arbiter.sweep_orphans(self.lease_id)

    def _lost(self):
        old = self.lease_id
        log.warning("ackqueue: this process's lease %s was expired by another process "
                    "(it did not beat for %.1f s); what it held was given back", old,
                    self.timeout)
        self._register()
        why = (f"this process's lease expired (it was unresponsive for more than "
               f"{self.timeout:g} s) and the message was given back")
        for arbiter in self.database.shared_arbiters():
            arbiter.lease_lost(why)

    def _judge_others(self):
        def read():
            self._tm.begin()
            return {lid: (lease.beat, lease.timeout)
                    for lid, lease in store.ensure_leases(self._conn.root()).items()}
        try:
            leases = read_fresh(read, self._tm.abort)   # a pack may cut a snapshot short
        finally:
            self._tm.abort()
        now = monotonic()
        for lid in list(self._seen):
            if lid not in leases:
                del self._seen[lid]
        for lid, (beat, timeout) in leases.items():
            if lid == self.lease_id:
                continue
            seen = self._seen.get(lid)
            if seen is None or seen[0] != beat:
                self._seen[lid] = (beat, now)
            elif now - seen[1] >= timeout:
                op = store.ExpireLease(lid, beat)
                try:
                    self.database.committer.submit([op]).wait()
                except store.Refused:
                    continue          # it beat meanwhile, or someone else expired it
                self.expired_leases += 1
                del self._seen[lid]
                log.warning("ackqueue: lease %s stopped beating for %.1f s; gave back %d "
                            "message(s) it held", lid, timeout, op.given_back)

    def close(self):
        """Stop beating and drop the lease (call after giving back what is held)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self.database.committer.submit([store.DropLease(self.lease_id)]).wait()
        except Exception:  # the server may be gone; the lease then expires by itself
            log.warning("ackqueue: could not drop lease %s", self.lease_id, exc_info=True)
        try:
            self._conn.close()
        except Exception:
            pass
