"""``ackqueue top TARGET``: every queue's counts and in/out rates, refreshed each second (rates averaged over the last 10 s).

In a terminal it is a live table (rich) that quits on q or Ctrl-C; otherwise it prints a
plain table at each refresh (no control codes) until Ctrl-C or --iterations."""
import collections
import contextlib
import os
import select
import sys
import time

import click

from . import output

RATE_WINDOW = 10.0       # seconds the in/out rates are averaged over
COLUMNS = ["QUEUE", "READY", "IN FLIGHT", "DELAYED", "IN/S", "OUT/S", "PUT", "ACKED",
           "DEAD"]


def rows(catalog, previous, elapsed):
    """Table rows: counts now, and rates since previous (a catalog elapsed seconds ago,
    up to RATE_WINDOW).
    In: messages put or moved in; out: acknowledged, dead-lettered, expired or purged."""
    result = []
    for name, info in sorted(catalog.items()):
        rates = ["-", "-"]
        before = previous.get(name) if previous else None
        if before is not None and elapsed > 0:
            rates = [f"{(_in(info) - _in(before)) / elapsed:,.1f}",
                     f"{(_out(info) - _out(before)) / elapsed:,.1f}"]
        result.append([name, f"{info['ready']:,}", f"{info['in_flight']:,}",
                       f"{info['delayed']:,}", *rates, f"{info['put']:,}",
                       f"{info['acked']:,}", f"{info['dead_lettered']:,}"])
    return result


def _in(info):
    return info["put"] + info["moved_in"]


def _out(info):
    return info["acked"] + info["dead_lettered"] + info["expired"] + info["purged"]


class Rates:
    """The catalogs of the last RATE_WINDOW seconds: rates are averaged over them, so a
    burst stays visible for a while instead of one refresh."""

    def __init__(self):
        self.history = collections.deque()

    def add(self, catalog):
        """Record catalog (now) and return (earlier catalog, seconds since it) to compute
        rates against (None, 0 at the first refresh)."""
        now = time.monotonic()
        while len(self.history) > 1 and now - self.history[1][0] >= RATE_WINDOW:
            self.history.popleft()
        earlier = self.history[0] if self.history else (now, None)
        self.history.append((now, catalog))
        return earlier[1], now - earlier[0]


def run_top(target, where, interval=1.0, iterations=None):
    if sys.stdout.isatty() and sys.stdin.isatty() and output.rich_available():
        return _live(target, where, interval, iterations)
    return _plain(target, where, interval, iterations)


def _plain(target, where, interval, iterations):
    rates, n = Rates(), 0
    try:
        while iterations is None or n < iterations:
            now = time.monotonic()
            catalog = target.catalog()
            click.echo(f"{time.strftime('%H:%M:%S')}  {where}  {len(catalog)} queue(s)")
            output.table(rows(catalog, *rates.add(catalog)), COLUMNS,
                         right=set(range(1, len(COLUMNS))))
            click.echo()
            n += 1
            if iterations is None or n < iterations:
                time.sleep(max(0.0, interval - (time.monotonic() - now)))
    except KeyboardInterrupt:
        pass


def _live(target, where, interval, iterations):
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    def render(catalog, previous, elapsed):
        table = Table(title=f"ackqueue top  {where}  (q to quit)", expand=False)
        for i, column in enumerate(COLUMNS):
            table.add_column(column, justify="left" if i == 0 else "right")
        for row in rows(catalog, previous, elapsed):
            table.add_row(*row)
        if not catalog:
            table.caption = "no queues yet"
        return table

    rates, n = Rates(), 0
    console = Console()
    try:
        with _keys() as pressed, Live(console=console, auto_refresh=False,
                                      screen=False) as live:
            while iterations is None or n < iterations:
                now = time.monotonic()
                catalog = target.catalog()
                live.update(render(catalog, *rates.add(catalog)), refresh=True)
                n += 1
                if pressed(max(0.0, interval - (time.monotonic() - now))) == "q":
                    break
    except KeyboardInterrupt:
        pass


@contextlib.contextmanager
def _keys():
    """pressed(timeout) -> the key pressed within timeout seconds, or None (the terminal in
    cbreak mode meanwhile, so q needs no Enter; restored on exit)."""
    import termios
    import tty
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def pressed(timeout):
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode("utf-8", "replace").lower() if ready else None
    try:
        yield pressed
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
