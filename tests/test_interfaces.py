"""Every implementation of every contract in ackqueue/interfaces.py provides it, checked
with zope.interface.verify.verifyObject on live objects (the transaction package's habit):
a queue in memory and on a file (Database, QueueState, QueueConnection, LocalArbiter, a
Ticket), a queue shared through a real ZEO server (SharedArbiter), and a queue reached
through a real ``ackqueue serve`` (RemoteDatabase, RemoteState, RemoteConnection), and the
service's own parts on a queue file (its backend, a client's connection, the runtime)."""
import threading

import pytest
from zope.interface.verify import verifyClass, verifyObject

from ackqueue import AckLifoQueue, AckPriorityQueue, AckQueue
from ackqueue import interfaces as I
from ackqueue.arbiters.local import LocalArbiter
from ackqueue.arbiters.shared import SharedArbiter
from ackqueue.commit import Ticket
from ackqueue.connection import QueueConnection
from ackqueue.database import Database
from ackqueue.remote.connection import RemoteConnection
from ackqueue.remote.database import RemoteDatabase, RemoteState
from ackqueue.service.backend import ClientConn, Service
from ackqueue.service.runtime import Api
from ackqueue.state import QueueState

IMPLEMENTATIONS = [
    (I.IQueueFront, AckQueue), (I.IQueueFront, AckLifoQueue),
    (I.IQueueFront, AckPriorityQueue),
    (I.IDatabase, Database), (I.IDatabase, RemoteDatabase),
    (I.IProxy, QueueConnection), (I.IQueueConnection, QueueConnection),
    (I.IProxy, RemoteConnection), (I.IRemoteConnection, RemoteConnection),
    (I.IFrontState, QueueState), (I.IQueueState, QueueState), (I.IFrontState, RemoteState),
    (I.IArbiter, LocalArbiter), (I.ILocalArbiter, LocalArbiter),
    (I.IArbiter, SharedArbiter), (I.ISharedArbiter, SharedArbiter),
    (I.ITicket, Ticket),
    (I.IServiceBackend, Service), (I.IClientConnection, ClientConn),
    (I.IServiceRuntime, Api),
]


@pytest.mark.parametrize("iface, cls", IMPLEMENTATIONS,
                         ids=[f"{c.__name__}-{i.__name__}" for i, c in IMPLEMENTATIONS])
def test_each_class_declares_and_provides_its_contract(iface, cls):
    assert iface.implementedBy(cls)
    assert verifyClass(iface, cls)


def test_every_interface_has_an_implementation_checked_here():
    declared = {getattr(I, n) for n in I.__all__}
    assert declared == {i for i, _ in IMPLEMENTATIONS}


def _verify_local_queue(q):
    assert verifyObject(I.IQueueFront, q)
    assert verifyObject(I.IDatabase, q.database)
    assert q.database.proxy_class is QueueConnection
    assert verifyObject(I.IQueueState, q.state)
    conn = q.connect()
    try:
        assert verifyObject(I.IQueueConnection, conn)
        assert conn.owned_by(threading.current_thread())
    finally:
        conn.close()
    ticket = q.database.committer.submit([])
    ticket.wait(30)
    assert verifyObject(I.ITicket, ticket) and ticket.finished()


def test_a_queue_in_memory_provides_its_contracts():
    with AckQueue() as q:
        _verify_local_queue(q)
        assert verifyObject(I.ILocalArbiter, q.state.arbiter)


def test_a_queue_file_provides_its_contracts(tmp_path):
    with AckPriorityQueue(path=tmp_path / "q.fs") as q:
        _verify_local_queue(q)
        assert verifyObject(I.ILocalArbiter, q.state.arbiter)


def test_a_queue_shared_through_a_zeo_server_provides_its_contracts(server):
    with AckQueue(path=server.url, name="zeo") as q:
        _verify_local_queue(q)
        assert verifyObject(I.ISharedArbiter, q.state.arbiter)


def test_a_queue_through_the_service_provides_its_contracts(own_service):
    pytest.importorskip("aiohttp")
    service = own_service()
    with AckQueue(path=service.url, name="remote") as q:
        assert verifyObject(I.IQueueFront, q)
        assert verifyObject(I.IDatabase, q.database)
        assert q.database.proxy_class is RemoteConnection
        assert verifyObject(I.IFrontState, q.state)
        q.put("x")
        assert q.get(timeout=30) == "x"
        q.task_done()
        conn = q.connect()
        try:
            assert verifyObject(I.IRemoteConnection, conn)
            assert conn.owned_by(threading.current_thread())
        finally:
            conn.close()
    assert service.stop() == 0


def test_the_service_parts_provide_their_contracts(tmp_path):
    from ackqueue.service.app import API, make_app
    service = Service(str(tmp_path / "service.fs"))
    try:
        api = make_app(service, pool_size=2)[API]
        assert verifyObject(I.IServiceBackend, service)
        assert verifyObject(I.IServiceRuntime, api) and api.service is service
        cc = service.client_conn(api.session("client-1"), "jobs")
        assert verifyObject(I.IClientConnection, cc)
        assert cc.queue is service.queues["jobs"]
        api.pool.shutdown()
    finally:
        service.close()
