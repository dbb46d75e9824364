"""The ackqueue command: ``ackqueue demo`` (and ``python -m ackqueue demo``)."""
import argparse
import sys

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
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(jobs=args.jobs, workers=args.workers, directory=args.dir,
                        seed=args.seed, quiet=args.quiet)
    parser.print_help(sys.stderr)
    return 2
