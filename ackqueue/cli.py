"""The ackqueue command: ``ackqueue demo``, ``ackqueue server PATH --listen HOST:PORT``,
``ackqueue serve PATH|--memory`` (the HTTP queue service; also as ``python -m ackqueue``)."""
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
    svc = commands.add_parser(
        "serve", help="the queue service: one process owns the queue file and serves the "
                      "native HTTP API (needs pip install 'ackqueue[service]')")
    where = svc.add_mutually_exclusive_group(required=True)
    where.add_argument("path", nargs="?", help="the queue file (created if missing)")
    where.add_argument("--memory", action="store_true",
                       help="serve in-memory queues (nothing survives the process)")
    svc.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    svc.add_argument("--port", type=int, default=8080,
                     help="TCP port (default 8080; 0 picks a free one)")
    svc.add_argument("--socket", metavar="PATH", help="also serve on this Unix socket")
    svc.add_argument("--durability", choices=("fsync", "os"), default="fsync",
                     help="fsync: every commit survives a power cut (default); os: "
                          "commits survive a crash of the service, not of the machine")
    svc.add_argument("--lease-timeout", type=float, default=30.0, metavar="SECONDS",
                     help="a client that sends nothing for this long loses what it holds "
                          "(default 30)")
    svc.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                     help="the largest message body (default 1 MiB)")
    svc.add_argument("--threads", type=int, default=64,
                     help="thread pool for blocking queue calls (default 64)")
    svc.add_argument("--loop", choices=("asyncio", "uvloop", "auto"), default="asyncio",
                     help="event loop (default asyncio; uvloop if installed, auto: uvloop "
                          "when installed; see README for why asyncio is the default)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        if not 0 <= args.port <= 65535:
            parser.error(f"port {args.port} is out of range")
        if not args.lease_timeout > 0 or args.max_body < 1 or args.threads < 1:
            parser.error("--lease-timeout, --max-body and --threads must be positive")
        if args.memory and args.durability != "fsync":
            parser.error("--durability applies to a queue file, not --memory")
        try:
            from .service.server import serve as run_service
        except ImportError as exc:
            parser.error(f"the queue service needs aiohttp ({exc}): "
                         "pip install 'ackqueue[service]'")
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return run_service(None if args.memory else args.path, args.host, args.port,
                           socket_path=args.socket, durability=args.durability,
                           lease_timeout=args.lease_timeout, pool_size=args.threads,
                           max_body=args.max_body, loop=args.loop)
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
