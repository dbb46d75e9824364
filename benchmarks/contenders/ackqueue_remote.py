"""The remote drop-in: `ackqueue serve` on loopback, AckQueue(path="http://...") in every
process.  One put, one get (a long poll) and one ack request per item; the service
group-commits every client's requests (fsync'd)."""
from benchmarks.common import SHARED_QUEUE_NAME
from benchmarks.contenders.ackqueue import AckQueueAdapter
from benchmarks.contenders.base import Contender, SharedContender
from benchmarks.contenders.service import ServiceServer   # the service contender's server


def start_service(directory):
    """provision(): one service per run, on a fresh file."""
    service = ServiceServer(directory)
    return service.url, service


SHARED = SharedContender(
    "ackqueue-remote", "ackqueue (remote)", "ackqueue", "blocking",
    "one `ackqueue serve` per run on a fresh file (every commit fsync'd, requests of all "
    "clients group-committed); every process opens "
    f"AckQueue(path='http://127.0.0.1:PORT', name={SHARED_QUEUE_NAME!r}); get() is the "
    "service's long poll; put, get and ack one request each",
    start_service, lambda location, mode: AckQueueAdapter(None, url=location))

# The fewer-requests path: ack_with_next_get=True (an ack rides on the thread's next get,
# or is sent within 50 ms): two requests per item, but an ack is durable only by then.
SHARED_ACK_WITH_GET = SharedContender(
    "ackqueue-remote-ackget", "ackqueue (remote, ack with next get)", "ackqueue", "blocking",
    "as ackqueue (remote), with AckQueue(..., ack_with_next_get=True): ack() returns at "
    "once and the ack travels with the same thread's next get (durable before that get "
    "returns) or within 50 ms",
    start_service,
    lambda location, mode: AckQueueAdapter(None, url=location, ack_with_next_get=True))



def start_service_os(directory):
    """provision() of the wake-path floor: the service's commits not fsync'd."""
    service = ServiceServer(directory, "--durability", "os")
    return service.url, service


# (e) across processes only: the same path with the service's commits written to the OS
# without fsync (ackqueue serve --durability os), measured beside the fsync'd one in the
# same run, so the wake path's own cost shows apart from the put's fsync.
SHARED_OS = SharedContender(
    "ackqueue-remote-os", "ackqueue (remote, durability os)", "ackqueue", "blocking",
    "as ackqueue (remote), the service started with --durability os (commits reach the "
    "OS, no fsync): the floor of the wake path without the disk's flush",
    start_service_os, lambda location, mode: AckQueueAdapter(None, url=location),
    scenarios=("e_xproc",))


class RemoteAckQueueAdapter(AckQueueAdapter):
    """(a)-(d) in one process: starts `ackqueue serve` on a fresh file in the run's
    directory, opens AckQueue(path="http://127.0.0.1:PORT", name=...), and stops the
    service (SIGTERM) after closing the queue.  The service's start is not timed."""

    def __init__(self, directory, **options):
        self.service = ServiceServer(directory)
        self.server_report = None
        try:
            super().__init__(directory, url=self.service.url, **options)
        except BaseException:
            self.server_report = self.service.stop()
            raise

    def close(self):
        try:
            super().close()
        finally:
            self.server_report = self.service.stop()


CONTENDER = Contender(
    "ackqueue-remote", "ackqueue (remote)", RemoteAckQueueAdapter,
    "the queue service: one `ackqueue serve` (ZODB FileStorage, every commit fsync'd, "
    "group-committed across requests) on loopback, started per run on a fresh file; the "
    "client opens AckQueue(path='http://127.0.0.1:PORT'); put and ack return once the "
    "service has committed", family="ackqueue", counts={"n": 500, "batch_n": 1000})
