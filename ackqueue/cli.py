"""The ackqueue command: ``ackqueue demo``, ``ackqueue server PATH --listen HOST:PORT``,
``ackqueue serve PATH|--memory`` (the HTTP queue service) and the operator's commands (ls,
stats, peek, put, get, purge, redrive, pack, export, import, check, top), also as
``python -m ackqueue ...``.  The commands are a click group in ackqueue.operator.commands."""

__all__ = ["main"]


def main(argv=None):
    from .operator.commands import main as run
    return run(argv)
