"""A Spark Structured Streaming job for tests/spark/test_spark.py, run as its own driver
process (so the test can SIGKILL it, JVM and Python workers with it, as a crashed driver).

    python spark_driver.py URL IN_QUEUE OUT_QUEUE CHECKPOINT STALL_MARKER

Reads IN_QUEUE with Trigger.AvailableNow (100 messages a batch, 2 parts) and writes each
message's text to OUT_QUEUE.  The message "stall" stops its task for good, after creating
STALL_MARKER, the first time only (while the marker does not exist): the test kills the
driver then, in the middle of that batch.  Exits 0 when the query has read everything.
"""
import os
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql.functions import udf

import ackqueue.spark


def main(url, in_queue, out_queue, checkpoint, marker):
    spark = (SparkSession.builder.master("local[2]").appName("ackqueue-kill-test")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    ackqueue.spark.register(spark)

    @udf("string")
    def stall_once(text):
        if text == "stall" and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(3600)        # held here until the test SIGKILLs this driver
        return text

    rows = (spark.readStream.format("ackqueue").option("url", url)
            .option("queue", in_queue).option("maxMessagesPerBatch", "100")
            .option("numPartitions", "2").load())
    query = (rows.select(stall_once("text").alias("body")).writeStream.format("ackqueue")
             .option("url", url).option("queue", out_queue).option("rowsPerRequest", "10")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    print("batches", [p["batchId"] for p in query.recentProgress], flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
