"""The registry of child tasks: what ``python -m benchmarks --child TASK ARGS...`` runs.

The one module that imports the children's entry points (they live with their scenario
or contender); nothing imports it but runner.main, which hands it ``--child``'s argv.
The plumbing the parents and children share (starting a child, its report lines,
stopping a server) is children.py's, which imports none of them.
"""


def _tasks():
    """{task name: entry point}; imported here, when a child starts, not by the parent."""
    from benchmarks.contenders import wake_floor
    from benchmarks.contenders.sqs import null_server_main
    from benchmarks.scenarios import (e_xproc, f_scale, g_processes, service, service_floor,
                                      sqs)
    return {"sprod": service.child_producer, "scons": service.child_consumer,
            "sfloorsrv": service.child_floor_server,
            "sfloorcli": service.child_floor_client,
            "sdurablesrv": service_floor.child_server,
            "sdurablecli": service_floor.child_client,
            "swakefloor": wake_floor.child_server,
            "fill": f_scale.child_fill, "open": f_scale.child_open,
            "xwake": e_xproc.child_xwake, "gprod": g_processes.child_producer,
            "gcons": g_processes.child_consumer, "gdrain": g_processes.child_drain,
            "qprod": sqs.child_producer, "qcons": sqs.child_consumer,
            "qnull": null_server_main}


def child_main(argv):
    """Entry point of every helper process (python -m benchmarks --child TASK ...)."""
    # The children of benchmarks/run.py imported lean.py (so ZODB) before measuring
    # anything; kept, so that the RSS figures of (f) stay comparable with earlier runs.
    from benchmarks import lean  # noqa: F401
    task = _tasks().get(argv[0])
    if task is None:
        raise SystemExit(f"unknown child task {argv[0]!r}")
    task(*argv[1:])
