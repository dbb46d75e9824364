"""The Spark source and sink (ackqueue.spark) on a real local Spark (local[2]) against a
real ``ackqueue serve``: a driver SIGKILLed in the middle of a batch and restarted from
its checkpoint loses nothing and writes each row once; a poison message reaches the
dead-letter queue after maxReceives; a snapshot read changes nothing.

One service and one SparkSession for the module (Spark takes seconds to start); the
killed driver is a process of its own (tests/spark/spark_driver.py)."""
import collections
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("no Java runtime (java on PATH or JAVA_HOME): Spark cannot start",
                allow_module_level=True)

from ackqueue import AckQueue  # noqa: E402
from ackqueue.spark.client import Client  # noqa: E402
from service_proc import Service  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = 300         # failure bound of every wait below (Spark is slow on a loaded machine)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    d = tmp_path_factory.mktemp("spark-service")
    svc = Service(d / "queues.fs", d / "service.log")
    yield svc
    assert svc.stop() == 0


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    import ackqueue.spark
    session = (SparkSession.builder.master("local[2]").appName("ackqueue-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    ackqueue.spark.register(session)
    yield session
    session.stop()


def bodies(url, queue):
    """Every message body (as text) of queue, read with browse (changes nothing)."""
    client, after, out = Client(url), -1, []
    import base64
    while True:
        page = client.browse(queue, after, 1000)
        out += [base64.b64decode(m["body"]).decode() for m in page["messages"]]
        after = page["next_after"]
        if after is None:
            client.close()
            return out


def wait_for(condition, what):
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)


def run_driver(service, tmp_path, in_q, out_q):
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "spark_driver.py"), service.url, in_q, out_q,
         str(tmp_path / "checkpoint"), str(tmp_path / "stalled")],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "driver.log", "ab"), text=True,
        start_new_session=True)     # its own process group: the JVM and workers with it


def test_driver_killed_mid_batch_loses_nothing_and_writes_each_row_once(service, tmp_path):
    inputs = [f"m{i:03d}" for i in range(200)]
    inputs[150] = "stall"                     # in the second batch (100 a batch)
    src = AckQueue(path=service.url, name="kill-in")
    src.put_many(inputs)
    out = AckQueue(path=service.url, name="kill-out")

    driver = run_driver(service, tmp_path, "kill-in", "kill-out")
    try:
        # The first batch is written, and the second is half written (its other part)
        # and stuck on "stall": kill the driver, its JVM and its Python workers.
        wait_for(lambda: (tmp_path / "stalled").exists() and out.qsize() >= 150,
                 "the driver to stall in its second batch")
        assert driver.poll() is None
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        driver.stdout.close()
    written = out.qsize()
    assert 150 <= written < 200, written                  # killed in the middle of batch 2
    counts = src.counts()
    # Batch 2's messages are in flight under its lease, which its record names.
    assert counts["in_flight"] == 100 and counts["ready"] == 0, counts
    [leased] = Client(service.url).streams("kill-in").values()
    assert leased["messages"] == 100, leased

    restarted = run_driver(service, tmp_path, "kill-in", "kill-out")
    try:
        stdout, _ = restarted.communicate(timeout=LIMIT)
    finally:
        if restarted.poll() is None:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait()
    assert restarted.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]

    got = collections.Counter(bodies(service.url, "kill-out"))
    assert got == collections.Counter(inputs)            # each row once, none lost
    stats = src.stats()
    assert stats["acked"] == 200 and stats["ready"] == 0 and stats["in_flight"] == 0, stats
    # The replay read the very messages batch 2 leased, a second receive of each: none
    # went back to the queue.
    assert stats["given_back"] == 0 and stats["redelivered"] == 100, stats


def test_driver_and_service_killed_mid_batch_lose_nothing_and_write_each_row_once(
        service, tmp_path):
    inputs = [f"n{i:03d}" for i in range(200)]
    inputs[150] = "stall"                     # in the second batch (100 a batch)
    AckQueue(path=service.url, name="crash-in").put_many(inputs)
    out = AckQueue(path=service.url, name="crash-out")
    driver = run_driver(service, tmp_path, "crash-in", "crash-out")
    try:
        wait_for(lambda: (tmp_path / "stalled").exists() and out.qsize() >= 150,
                 "the driver to stall in its second batch")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        driver.stdout.close()
    out.close()
    client = Client(service.url)
    [(stream, leased)] = client.streams("crash-in").items()
    assert leased == {"committed": 1, "parts": 2, "messages": 100}     # batch 2's lease
    service.kill()                            # the service too, then both come back
    service.start()
    assert client.streams("crash-in") == {stream: leased}
    assert client.counts("crash-in")["ready"] == 0
    assert client.counts("crash-in")["in_flight"] == 100      # still held after the restart

    restarted = run_driver(service, tmp_path, "crash-in", "crash-out")
    try:
        restarted.communicate(timeout=LIMIT)
    finally:
        if restarted.poll() is None:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait()
    assert restarted.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
    assert collections.Counter(bodies(service.url, "crash-out")) == collections.Counter(inputs)
    assert client.streams("crash-in")[stream] == {"committed": 2, "parts": 0, "messages": 0}
    stats = AckQueue(path=service.url, name="crash-in").stats()
    # The replay read the very messages batch 2 leased, a second receive of each: none
    # went back to the queue.
    assert stats["acked"] == 200 and stats["ready"] == 0 and stats["in_flight"] == 0, stats
    assert stats["given_back"] == 0 and stats["redelivered"] == 100, stats
    client.close()


def test_poison_message_reaches_the_dead_letter_queue_after_max_receives(
        service, spark, tmp_path):
    from pyspark.sql.functions import udf
    from pyspark.sql.utils import StreamingQueryException
    src = AckQueue(path=service.url, name="poison-in")
    src.put_many(["poison", "a"])

    @udf("string", useArrow=False)      # a plain Python UDF: no pandas needed
    def process(text):
        if text == "poison":
            raise ValueError("cannot process this one")
        return text.upper()

    def run():
        rows = (spark.readStream.format("ackqueue").option("url", service.url)
                .option("queue", "poison-in").option("numPartitions", "1")
                .option("maxReceives", "2").option("deadLetterQueue", "poison-dead").load())
        q = (rows.select(process("text").alias("body")).writeStream.format("ackqueue")
             .option("url", service.url).option("queue", "poison-out")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
        try:
            q.awaitTermination()
            return True
        except StreamingQueryException:
            return False

    # Runs 1 and 2 fail on the batch [poison, a]; run 3, its third read, halves it to
    # [poison] ("a" goes back to the queue) under a fresh count, and fails; run 4 fails
    # on the second read of [poison]; run 5, the third, moves it to the dead-letter queue,
    # and goes through, reading "a" again in its next batch.
    assert [run() for _ in range(5)] == [False] * 4 + [True]
    assert bodies(service.url, "poison-dead") == ["poison"]
    assert bodies(service.url, "poison-out") == ["A"]
    stats = src.stats()
    # "a" went back to its place in the queue when the part was halved (given back, not
    # put again), and was acknowledged by the run that went through.
    assert stats["ready"] == 0 and stats["in_flight"] == 0, stats
    assert stats["put"] == 2 and stats["acked"] == 1 and stats["given_back"] == 1, stats
    assert stats["dead_lettered"] == 1, stats


def test_snapshot_read_changes_nothing(service, spark):
    q = AckQueue(path=service.url, name="snap")
    q.put_many(["one", "two", "three"])
    q.put(b"\x00\x01", attributes={"k": "v"}, priority=7)
    held = q.get_message(timeout=10)                  # one in flight
    before = q.stats()
    rows = (spark.read.format("ackqueue").option("url", service.url)
            .option("queue", "snap").load().orderBy("id").collect())
    assert q.stats() == before
    assert [(r.text, r.state, r.receive_count) for r in rows] == [
        ("one", "in_flight", 1), ("two", "ready", 0), ("three", "ready", 0),
        (None, "ready", 0)]
    assert rows[3].body == b"\x00\x01" and rows[3].attributes == {"k": "v"}
    assert rows[3].priority == 7 and rows[3].encoding == "bytes"
    q.ack(held)                                       # still ours: nothing was taken
    assert q.counts() == {"ready": 3, "in_flight": 0, "delayed": 0}


def test_batch_write_puts_rows_with_their_priority_and_attributes(service, spark):
    df = spark.createDataFrame(
        [("x", 1, {"k": "1"}), ("y", 200, None), ("x", 1, {"k": "1"})],
        "body string, priority int, attributes map<string,string>")
    (df.write.format("ackqueue").option("url", service.url).option("queue", "written")
     .mode("append").save())
    q = AckQueue(path=service.url, name="written")
    got = [q.get_message(timeout=10) for _ in range(3)]
    assert [(m.body, m.priority, m.attributes) for m in got] == [
        ("y", 200, {}), ("x", 1, {"k": "1"}), ("x", 1, {"k": "1"})]   # equal rows both put
    assert q.qsize() == 0
    q.ack_many(got)
    plain = spark.createDataFrame([(b"\x00",)], "body binary")
    (plain.write.format("ackqueue").option("url", service.url).option("queue", "plain")
     .mode("append").save())
    m = AckQueue(path=service.url, name="plain").get_message(timeout=10)
    assert (m.body, m.priority) == (b"\x00", 100)          # the queue's default priority


def test_the_source_never_unpickles_and_the_sink_keeps_a_json_queues_codec(
        service, spark, tmp_path):
    import pickle

    class Creates:                    # unpickling it creates the marker file
        def __reduce__(self):
            return open, (str(tmp_path / "ran"), "w")
    q = AckQueue(path=service.url, name="guarded")
    q.put_many([pickle.dumps(Creates())], encoded=True)
    q.record_codec("json")            # recorded after the pickle went in
    rows = (spark.read.format("ackqueue").option("url", service.url)
            .option("queue", "guarded").load().collect())
    assert [(r.encoding, r.text, r.body) for r in rows] == [
        ("pickle", None, pickle.dumps(Creates()))]
    assert not (tmp_path / "ran").exists()
    good = spark.createDataFrame([('{"a": 1}',)], "body string")
    (good.write.format("ackqueue").option("url", service.url).option("queue", "guarded")
     .mode("append").save())
    bad = spark.createDataFrame([(b"\x80\x05K\x01.",)], "body binary")
    with pytest.raises(Exception, match="UnsupportedEncoding|codec 'json'"):
        (bad.write.format("ackqueue").option("url", service.url).option("queue", "guarded")
         .mode("append").save())
    from ackqueue import codec
    assert [m.item for m in q.browse() if codec.kind(m.body) == "json"] == [{"a": 1}]
