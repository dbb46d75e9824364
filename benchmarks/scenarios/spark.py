"""(spark) The Spark source and sink, on local[2], in one run:

For micro-batches of 1,000 and 10,000 messages, messages/s through
- Spark's built-in ``rate-micro-batch`` source (rows made in the JVM) into the noop sink;
- Spark's JSON file source (maxFilesPerTrigger=1, one file per micro-batch) reading the
  same messages as JSON lines, into the noop sink;
- the ackqueue source (``ackqueue serve``, fsync'd) into the noop sink: receive, lease,
  acknowledge on commit;
- the JSON file source into the ackqueue sink (rows put with dedup ids).
and the floors under the queue source, measured in the same run: a Python data source that
only generates rows (the cost of Spark's Python source path, no I/O), and the service's
leased-batch path alone (read + commit requests from one Python process, the answers made
into the source's Arrow batches, no Spark); and
under the sink, the service's row-put path alone (1,000 rows a request with dedup ids).

Each rate is rows over the summed ``triggerExecution`` time of the micro-batches that had
rows (Spark's own progress reports), so the query's start-up is left out alike for all.
Target: the queue source within 2x of the file source per message.
"""
import json
import os
import sys
import time
import traceback

from benchmarks.common import REPO

KEY = "spark"
TITLE = "(spark) the Spark source and sink: messages/s on local[2]"
BATCHES = (1000, 10000)
LIMIT = 900.0


def counts(args):
    return {"n": 10000 if args.quick else 40000}


def _body(i):
    return json.dumps({"n": i, "payload": "x" * 70})


def _rate(query):
    rows = secs = batches = 0
    for p in query.recentProgress:
        if p["numInputRows"]:
            rows += p["numInputRows"]
            secs += p["durationMs"].get("triggerExecution", 0) / 1000.0
            batches += 1
    return {"rows": rows, "seconds": secs, "batches": batches,
            "rate": rows / secs if secs else None}


def _until(query, n):
    """Run a query that never ends by itself until n rows went through, then stop it."""
    deadline = time.monotonic() + LIMIT
    while sum(p["numInputRows"] for p in query.recentProgress) < n:
        if time.monotonic() > deadline or not query.isActive:
            break
        query.awaitTermination(0.2)
    query.stop()


def _available_now(df, fmt="noop", **options):
    w = df.writeStream.format(fmt).trigger(availableNow=True)
    for k, v in options.items():
        w = w.option(k, v)
    q = w.start()
    q.awaitTermination(LIMIT)
    if q.isActive:
        q.stop()
    return _rate(q)


def _write_json(directory, n, batch):
    os.makedirs(directory)
    for f in range(0, n, batch):
        with open(os.path.join(directory, f"part-{f:08d}.json"), "w") as out:
            out.writelines(json.dumps({"body": _body(i)}) + "\n"
                           for i in range(f, min(n, f + batch)))


def _fill(url, queue, n):
    from ackqueue import AckQueue
    q = AckQueue(path=url, name=queue)
    for i in range(0, n, 1000):
        q.put_many([_body(j) for j in range(i, min(n, i + 1000))])
    q.close()


def _service_floor(url, queue, n, batch):
    """The leased-batch path alone: read parts of `batch` (the source's columnar answer,
    made into the Arrow batch the source hands Spark) and commit, until n are read."""
    from ackqueue.spark.client import Client
    from ackqueue.spark.options import columns_to_arrow
    c = Client(url)
    got, seq, t0 = 0, 0, time.perf_counter()
    while got < n:
        seq += 1
        for part in range(2):
            head, offsets, data = c.read_columns(queue, "floor", seq, part,
                                                 (batch + 1) // 2, 600)
            if head["ids"]:
                got += len(columns_to_arrow(head, offsets, data, "in_flight"))
        c.commit(queue, "floor", seq)
    secs = time.perf_counter() - t0
    c.close()
    return {"rows": got, "seconds": secs, "batches": seq, "rate": got / secs}


def _sink_floor(url, queue, n):
    """The row-put path alone: 1,000 rows a request with dedup ids, as the sink sends."""
    from ackqueue.spark.client import Client
    c = Client(url)
    rows, t0 = 0, time.perf_counter()
    for start in range(0, n, 1000):
        bodies = [_body(i).encode() for i in range(start, min(n, start + 1000))]
        c.put_rows(queue, bodies, [f"floor:{start + i}" for i in range(len(bodies))],
                   [100] * len(bodies), [None] * len(bodies), "str", 86400)
        rows += len(bodies)
    secs = time.perf_counter() - t0
    c.close()
    return {"rows": rows, "seconds": secs, "batches": (n + 999) // 1000, "rate": rows / secs}


def _one(out, name, fn):
    try:
        out[name] = fn()
        r = out[name]
        print(f"    {name}: {r['rows']} rows in {r['batches']} batches, "
              f"{(r['rate'] or 0):,.0f} rows/s", flush=True)
    except Exception as exc:   # noqa: BLE001
        out[name] = {"error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()}
        print(f"    {name}: FAILED {exc}", flush=True)


def _session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    from pyspark.sql import SparkSession
    import ackqueue.spark
    from benchmarks.scenarios.spark_gen import GenSource
    spark = (SparkSession.builder.master("local[2]").appName("ackqueue-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ackqueue.spark.register(spark)
    spark.dataSource.register(GenSource)
    return spark


def _batch_size(spark, server, tmp, n, batch):
    out = {}
    url = server.url
    files = os.path.join(tmp, f"json-{batch}")
    _write_json(files, n, batch)
    _fill(url, f"src-{batch}", n)
    _fill(url, f"floor-{batch}", n)

    def rate():
        q = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", batch)
             .load().writeStream.format("noop").start())
        _until(q, n)
        return _rate(q)

    def json_source():
        return _available_now(
            spark.readStream.format("json").schema("body STRING")
            .option("maxFilesPerTrigger", 1).load(files),
            checkpointLocation=os.path.join(tmp, f"ck-json-{batch}"))

    def generated():
        return _available_now(
            spark.readStream.format("bench_gen").option("n", n).option("batch", batch)
            .load(), checkpointLocation=os.path.join(tmp, f"ck-gen-{batch}"))

    def ackqueue_source():
        return _available_now(
            spark.readStream.format("ackqueue").option("url", url)
            .option("queue", f"src-{batch}").option("maxMessagesPerBatch", batch).load(),
            checkpointLocation=os.path.join(tmp, f"ck-aq-{batch}"))

    def ackqueue_sink():
        return _available_now(
            spark.readStream.format("json").schema("body STRING")
            .option("maxFilesPerTrigger", 1).load(files), "ackqueue", url=url,
            queue=f"sink-{batch}", checkpointLocation=os.path.join(tmp, f"ck-sink-{batch}"))

    for name, fn in (("rate source", rate), ("JSON file source", json_source),
                     ("Python source, rows generated", generated),
                     ("ackqueue source", ackqueue_source),
                     ("JSON file source -> ackqueue sink", ackqueue_sink),
                     ("service leased-batch path, no Spark",
                      lambda: _service_floor(url, f"floor-{batch}", n, batch)),
                     ("service row-put path, no Spark",
                      lambda: _sink_floor(url, f"sink-floor-{batch}", n))):
        _one(out, name, fn)
    from ackqueue import AckQueue
    out["ackqueue source left"] = AckQueue(path=url, name=f"src-{batch}").counts()
    out["ackqueue sink holds"] = AckQueue(path=url, name=f"sink-{batch}").qsize()
    return out


def run(args, shared, tmp_root):
    """{description, count, results: {batch: {contender: {rows, seconds, rate}}}}."""
    import tempfile
    from benchmarks.contenders.service import ServiceServer
    n = counts(args)["n"]
    result = {"title": TITLE, "description": __doc__.split("\n\n")[1], "count": n,
              "results": {}}
    print(f"\n{TITLE} ({n} messages per contender and batch size)", flush=True)
    tmp = tempfile.mkdtemp(prefix="ackqueue-spark-", dir=tmp_root)
    server = ServiceServer(tmp)
    spark = None
    try:
        spark = _session()
        for batch in BATCHES:
            print(f"  batches of {batch}:", flush=True)
            result["results"][str(batch)] = _batch_size(spark, server, tmp, n, batch)
    except Exception as exc:   # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    finally:
        if spark is not None:
            spark.stop()
        result["server"] = server.stop()
    return result
