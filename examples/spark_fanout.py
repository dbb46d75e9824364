"""A crawler-style fan-out through Spark Structured Streaming, end to end, in one command:

    python examples/spark_fanout.py [--pages 2000] [--batch 500]

1. starts ``ackqueue serve`` on a temporary file;
2. a producer puts PAGES messages {"page": i, "links": k} (k = 1 + i % 7) into "pages";
3. a Spark job (local[2], Trigger.AvailableNow) reads "pages" with the ackqueue source,
   fans each page out into its k links and writes them to "links" with the ackqueue sink,
   printing each micro-batch as it ends;
4. a plain Python worker consumes "links" with AckQueue (get, ack);
5. checks, with numbers computed from the input, that every page was acknowledged once and
   every link arrived exactly once; exits 1 if not.

Needs the spark extra (pip install -e ".[spark,service]") and Java 17.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time


def start_service(path):
    proc = subprocess.Popen([sys.executable, "-m", "ackqueue", "serve", path, "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    if not found:
        proc.kill()
        sys.exit(f"the service did not start: {line!r}")
    return proc, found.group(1)


def produce(url, pages):
    from ackqueue import AckQueue
    q = AckQueue(path=url, name="pages")
    docs = [json.dumps({"page": i, "links": 1 + i % 7}) for i in range(pages)]
    for i in range(0, pages, 1000):
        q.put_many(docs[i:i + 1000])
    q.close()
    return sum(1 + i % 7 for i in range(pages))


def run_spark(url, batch, checkpoint):
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    import ackqueue.spark
    spark = (SparkSession.builder.master("local[2]").appName("ackqueue-fanout")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ackqueue.spark.register(spark)
    pages = (spark.readStream.format("ackqueue").option("url", url).option("queue", "pages")
             .option("maxMessagesPerBatch", str(batch)).load()
             .select(F.from_json("text", "page INT, links INT").alias("p")))
    links = pages.select("p.page", F.explode(F.sequence(F.lit(1), "p.links")).alias("link"))
    query = (links.select(F.to_json(F.struct("page", "link")).alias("body"))
             .writeStream.format("ackqueue").option("url", url).option("queue", "links")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    shown = set()
    while query.isActive or len(shown) < len(query.recentProgress):
        for p in query.recentProgress:
            if p["batchId"] not in shown:
                shown.add(p["batchId"])
                print(f"  spark batch {p['batchId']}: {p['numInputRows']} pages in, "
                      f"{p['processedRowsPerSecond']:.0f} rows/s", flush=True)
        query.awaitTermination(0.5)
    query.awaitTermination()
    spark.stop()


def consume(url):
    """A plain Python worker: every link message, acknowledged one by one."""
    import queue
    from ackqueue import AckQueue
    q = AckQueue(path=url, name="links")
    seen = collections.Counter()
    while True:
        try:
            doc = q.get(timeout=2)
        except queue.Empty:
            break
        link = json.loads(doc)
        seen[(link["page"], link["link"])] += 1
        q.ack(doc)
    q.close()
    return seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=500)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory() as tmp:
        service, url = start_service(os.path.join(tmp, "queues.fs"))
        try:
            t0 = time.time()
            expected = produce(url, args.pages)
            print(f"put {args.pages} pages (expecting {expected} links) into {url}")
            run_spark(url, args.batch, os.path.join(tmp, "checkpoint"))
            seen = consume(url)
            from ackqueue import AckQueue
            stats = AckQueue(path=url, name="pages").stats()
        finally:
            service.terminate()
            service.wait()
    want = {(i, k) for i in range(args.pages) for k in range(1, 2 + i % 7)}
    missing = len(want - set(seen))
    extra = len(set(seen) - want)
    twice = sum(n - 1 for n in seen.values())
    print(f"pages acknowledged: {stats['acked']} of {args.pages} (left: ready "
          f"{stats['ready']}, in flight {stats['in_flight']})")
    print(f"links consumed: {sum(seen.values())}, distinct {len(seen)}, expected "
          f"{expected}; missing {missing}, unexpected {extra}, duplicates {twice}")
    print(f"end to end in {time.time() - t0:.1f} s")
    ok = (stats["acked"] == args.pages and stats["ready"] == stats["in_flight"] == 0
          and missing == extra == twice == 0 and sum(seen.values()) == expected)
    print("OK: every page once, every link exactly once" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
