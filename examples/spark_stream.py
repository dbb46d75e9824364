# examples/spark_stream.py; start the service first: ackqueue serve jobs.fs
import os
import tempfile

import ackqueue.spark                   # before Spark starts: its workers run this Python
from ackqueue import AckQueue
from pyspark.sql import SparkSession

url = os.environ.get("ACKQUEUE_URL", "http://127.0.0.1:8080")   # ackqueue serve's address
spark = SparkSession.builder.master("local[2]").appName("ackqueue-stream").getOrCreate()
ackqueue.spark.register(spark)
with AckQueue(path=url, name="events") as q:
    q.put_many(["first", "second", "third"])                     # something to read

# 1. a stream that acknowledges on commit
events = (spark.readStream.format("ackqueue").option("url", url)
          .option("queue", "events").option("maxMessagesPerBatch", 10000).load())
# 2. a sink that writes each row once: a body column (string or binary), optional
#    priority (int) and attributes (map<string,string>).  A real job keeps its
#    checkpoint in a lasting place and runs without availableNow (until stopped).
with tempfile.TemporaryDirectory() as checkpoint:
    query = (events.selectExpr("upper(text) AS body").writeStream.format("ackqueue")
             .option("url", url).option("queue", "results")
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())       # what is queued now, then stop
    query.awaitTermination()
# 3. a snapshot of what is queued (ready, delayed and in flight), changing nothing
(spark.read.format("ackqueue").option("url", url).option("queue", "results").load()
 .select("text", "state").show())
spark.stop()
