"""The service's figures (ackqueue.service.stats) in Prometheus' text format, written by
prometheus_client (pip install 'ackqueue[service]').

Per queue (label ``queue``):

- gauges ackqueue_queue_ready, ackqueue_queue_in_flight, ackqueue_queue_delayed, and
  ackqueue_queue_oldest_ready_age_seconds (only for a queue with a ready message);
- counters ackqueue_queue_<total>_total for each lifetime total of ``q.stats()``: put,
  acked, redelivered, given_back, dead_lettered, dropped, expired, purged, moved_in,
  redriven, missing.

The service: gauges ackqueue_service_long_polls (requests waiting in a long poll),
ackqueue_service_threads, ackqueue_service_clients (client leases),
ackqueue_service_queues_open and ackqueue_service_uptime_seconds.
"""
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["families", "render"]

_GAUGES = (("ready", "messages ready to be received"),
           ("in_flight", "messages received and not yet acknowledged"),
           ("delayed", "messages put with a delay that is not over yet"))
_SERVICE = (("long_polls", "ackqueue_service_long_polls", "requests waiting in a long poll"),
            ("threads", "ackqueue_service_threads", "threads of the service process"),
            ("clients", "ackqueue_service_clients", "client leases held"),
            ("queues_open", "ackqueue_service_queues_open", "queues the service has open"),
            ("uptime", "ackqueue_service_uptime_seconds", "seconds since the service started"))


def families(doc):
    """Metric families of a figures document (Figures.read())."""
    out = []
    for key, doc_text in _GAUGES:
        g = GaugeMetricFamily(f"ackqueue_queue_{key}", doc_text, labels=["queue"])
        for row in doc["queues"]:
            if row.get(key) is not None:
                g.add_metric([row["name"]], row[key])
        out.append(g)
    g = GaugeMetricFamily("ackqueue_queue_oldest_ready_age_seconds",
                          "seconds since the put of the message at the head of the ready set",
                          labels=["queue"])
    for row in doc["queues"]:
        if row.get("oldest_age") is not None:
            g.add_metric([row["name"]], row["oldest_age"])
    out.append(g)
    totals = sorted({k for row in doc["queues"] for k in row["totals"]})
    for key in totals:
        c = CounterMetricFamily(f"ackqueue_queue_{key}",
                                f"messages {key.replace('_', ' ')} since the queue was made "
                                "(lifetime total)", labels=["queue"])
        for row in doc["queues"]:
            value = row["totals"].get(key)
            if value is not None:
                c.add_metric([row["name"]], value)
        out.append(c)
    for key, name, doc_text in _SERVICE:
        out.append(GaugeMetricFamily(name, doc_text, value=doc["service"][key]))
    return out


class _Collected:
    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return self.fams


def render(doc):
    """(body bytes, content type) of the figures in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected(families(doc)))
    return generate_latest(registry), CONTENT_TYPE_LATEST
