"""The ackqueue command: ``ackqueue demo``, ``ackqueue server PATH --listen HOST:PORT``
(also as ``python -m ackqueue ...``)."""
import argparse
import logging
import sys

from .server import DEFAULT_PORT

__all__ = ["main"]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="ackqueue", description="A persistent, acknowledging drop-in for queue.Queue.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run the main job: producers, dying workers, a SIGKILLed process, "
                     "and a verification that nothing was lost")
    demo.add_argument("--jobs", type=int, default=3000, help="jobs to put (default 3000)")
    demo.add_argument("--workers", type=int, default=4, help="worker threads (default 4)")
    demo.add_argument("--dir", help="folder for the queue file (default: a temporary one)")
    demo.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    demo.add_argument("--quiet", action="store_true", help="no progress lines")
    server = commands.add_parser(
        "server", help="share a queue file with other processes and machines (ZEO server)")
    server.add_argument("path", help="the queue file to serve (created if missing)")
    server.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", metavar="HOST:PORT",
                        help=f"address to listen on (default 127.0.0.1:{DEFAULT_PORT}; "
                             "port 0 picks a free one)")
    server.add_argument("--durability", choices=("fsync", "os"), default="fsync",
                        help="fsync: every commit survives a power cut (default); os: "
                             "commits survive a crash of the server process, not of the "
                             "machine")
    args = parser.parse_args(argv)
    if args.command == "server":
        from .server import parse_listen, serve
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            host, port = parse_listen(args.listen)
        except ValueError as exc:
            parser.error(str(exc))
        return serve(args.path, host, port, durability=args.durability)
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(jobs=args.jobs, workers=args.workers, directory=args.dir,
                        seed=args.seed, quiet=args.quiet)
    parser.print_help(sys.stderr)
    return 2
