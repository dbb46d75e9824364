"""Output: plain aligned tables and JSON on stdout, progress bars on stderr.

Bars (rich) are drawn only when stderr is a terminal and rich is installed; otherwise
nothing is drawn and no control code is written, so scripts and pipes see plain text."""
import json
import sys

import click


def echo_json(value):
    click.echo(json.dumps(value, indent=None, sort_keys=True, default=str))


def table(rows, headers, right=()):
    """Rows of strings as aligned columns (the headers first)."""
    rows = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]

    def line(cells):
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()
    click.echo(line(headers))
    for row in rows:
        click.echo(line(row))


def seconds(value):
    """A duration for people: 0.4s, 12s, 3m05s, 2h01m, 3d04h."""
    if value is None:
        return "-"
    value = max(0.0, float(value))
    if value < 10:
        return f"{value:.1f}s"
    value = int(value)
    if value < 60:
        return f"{value}s"
    if value < 3600:
        return f"{value // 60}m{value % 60:02d}s"
    if value < 86400:
        return f"{value // 3600}h{value % 3600 // 60:02d}m"
    return f"{value // 86400}d{value % 86400 // 3600:02d}h"


def rich_available():
    import importlib
    try:
        importlib.import_module("rich")
    except ImportError:
        return False
    return True


def bars_enabled():
    return sys.stderr.isatty() and rich_available()


class Progress:
    """``with Progress("exporting", total=n) as bar: bar.advance(k)``: count, rate and time
    left on stderr when it is a terminal; nothing at all otherwise.  total=None draws an
    indeterminate bar (an operation the store does in one step, such as pack)."""

    def __init__(self, description, total=None, unit="messages"):
        self.description = description
        self.total = total
        self.unit = unit
        self._progress = None
        self._task = None

    def __enter__(self):
        if bars_enabled():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, ProgressColumn,
                                       SpinnerColumn, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)
            from rich.progress import Progress as RichProgress
            from rich.text import Text
            unit = self.unit

            class Rate(ProgressColumn):
                def render(self, task):
                    speed = task.finished_speed or task.speed
                    return Text("" if speed is None else f"{speed:,.0f} {unit}/s")

            if self.total is None:            # one store operation: how long it runs
                columns = [SpinnerColumn(), TextColumn("{task.description}"),
                           TimeElapsedColumn()]
            else:
                columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                           MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
                           TextColumn("left"), TimeRemainingColumn()]
            self._progress = RichProgress(*columns, console=Console(stderr=True),
                                          transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def advance(self, n=1):
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def update(self, completed=None, total=None):
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, total=total)

    def __exit__(self, *exc):
        if self._progress is not None:
            if exc[0] is None and self.total is not None:
                self._progress.update(self._task, completed=self.total)
            self._progress.__exit__(*exc)
        return False
