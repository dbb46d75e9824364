"""The ``ackqueue`` click group: the operator's commands, plus ``demo``, ``server`` and
``serve``."""
import json
import logging
import pickle
import socket
import sys
import time

import click

from ..errors import AckQueueError
from .. import store
from ..zeo.server import DEFAULT_PORT
from . import output
from .output import Progress, echo_json, table
from .targets import (EXIT_ERROR, CommandError, Target, one_line, user_errors)
from .transfer import BadLine, message_record, parse_line, queue_kind_of

IMPORT_BATCH = 500          # messages put in one commit by import and put -/--jsonl

GROUP_HELP = f"""A persistent, acknowledging drop-in for queue.Queue.

\b
Operator commands take the store first: ackqueue COMMAND TARGET ...
TARGET is a queue file (one process at a time: a file another process
holds is refused), the queue service, http://HOST:PORT (ackqueue serve;
https:// with TLS), or a queue server, zeo://HOST:PORT (ackqueue server).

\b
Example:
  ackqueue ls jobs.fs
  ackqueue ls http://127.0.0.1:8080
  ackqueue peek zeo://127.0.0.1:{DEFAULT_PORT} jobs -n 5

\b
Exit codes: 0 ok, 1 error, 2 usage, 3 queue not found.
"""

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Group(click.Group):
    def list_commands(self, ctx):          # in the order they are defined
        return list(self.commands)


@click.group(cls=Group, help=GROUP_HELP, context_settings=CONTEXT)
def cli():
    pass


json_option = click.option("--json", "as_json", is_flag=True,
                           help="print JSON (one document) for scripts")


# -- demo and server: the commands ackqueue had before, unchanged --------------------------

@cli.command(short_help="run the main job: producers, dying workers, a SIGKILLed process, "
                        "and a verification that nothing was lost")
@click.option("--jobs", type=int, default=3000, show_default=True, help="jobs to put")
@click.option("--workers", type=int, default=4, show_default=True, help="worker threads")
@click.option("--dir", "directory", help="folder for the queue file (default: a temporary one)")
@click.option("--seed", type=int, default=None, help="random seed (default: random)")
@click.option("--quiet", is_flag=True, help="no progress lines")
def demo(jobs, workers, directory, seed, quiet):
    """Run the main job: producers, dying workers, a SIGKILLed process, and a verification
    that nothing was lost.

    \b
    Example:
      ackqueue demo --jobs 500 --quiet
    """
    from ..demo import run_demo
    sys.exit(run_demo(jobs=jobs, workers=workers, directory=directory, seed=seed,
                      quiet=quiet))


@cli.command(short_help="share a queue file with other processes and machines (ZEO server)")
@click.argument("path")
@click.option("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", metavar="HOST:PORT",
              help=f"address to listen on (default 127.0.0.1:{DEFAULT_PORT}; port 0 picks "
                   "a free one)")
@click.option("--durability", type=click.Choice(["fsync", "os"]), default="fsync",
              help="fsync: every commit survives a power cut (default); os: commits "
                   "survive a crash of the server process, not of the machine")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="serve TLS with this certificate (PEM); with --tls-key and "
                   "--tls-client-ca")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="the certificate's private key (PEM)")
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="only clients presenting a certificate this CA signed get in")
@click.option("--insecure", is_flag=True,
              help="listen beyond this machine without TLS (anyone who reaches the port "
                   "can read, write, and make consumers unpickle what they put)")
def server(path, listen, durability, tls_cert, tls_key, tls_client_ca, insecure):
    """Share the queue file PATH (created if missing) with other processes and machines
    (a ZEO server); they open it as zeo://HOST:PORT.

    \b
    Example:
      ackqueue server jobs.fs --listen 127.0.0.1:8100
    """
    from ..zeo.server import parse_listen, serve
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    tls = (tls_cert, tls_key, tls_client_ca)
    if any(tls) and not all(tls):
        raise click.UsageError("TLS needs all three of --tls-cert, --tls-key and "
                               "--tls-client-ca")
    from ..zeo.tls import is_loopback
    if not is_loopback(host) and not all(tls) and not insecure:
        raise click.UsageError(
            f"refusing to serve {host} (beyond this machine) without TLS and client "
            "certificates: give --tls-cert, --tls-key and --tls-client-ca, or --insecure")
    try:
        code = serve(path, host, port, durability=durability,
                     tls=tls if all(tls) else None)
    except (AckQueueError, OSError, ValueError) as exc:    # one line, never a traceback
        raise CommandError(one_line(exc)) from None
    sys.exit(code)


def _check_serve_options(options):
    """(path, memory) of serve's options, once they are checked (UsageError)."""
    path, memory = options["path"], options["memory"]
    if (path is None) == (not memory):
        raise click.UsageError("give the queue file PATH or --memory (one of them)")
    if not 0 <= options["port"] <= 65535:
        raise click.UsageError(f"port {options['port']} is out of range")
    if (not options["lease_timeout"] > 0 or options["max_body"] < 1
            or options["threads"] < 1):
        raise click.UsageError("--lease-timeout, --max-body and --threads must be positive")
    if memory and options["durability"] != "fsync":
        raise click.UsageError("--durability applies to a queue file, not --memory")
    if memory and options.get("share_file"):
        raise click.UsageError("--share-file applies to a queue file, not --memory")
    return path, memory


@cli.command(short_help="the queue service: one process owns the queue file and serves the "
                        "native HTTP API (needs pip install 'ackqueue[service]')")
@click.argument("path", required=False)
@click.option("--memory", is_flag=True,
              help="serve in-memory queues (nothing survives the process)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address")
@click.option("--port", type=int, default=8080, show_default=True,
              help="TCP port (0 picks a free one)")
@click.option("--socket", "socket_path", metavar="PATH", help="also serve on this Unix socket")
@click.option("--share-file", is_flag=True,
              help="also serve the processes of this machine that open PATH itself "
                   "(AckQueue(path=PATH)), over the lean wire on PATH.sock")
@click.option("--durability", type=click.Choice(["fsync", "os"]), default="fsync",
              show_default=True,
              help="fsync: every commit survives a power cut; os: commits survive a crash "
                   "of the service, not of the machine")
@click.option("--lease-timeout", type=float, default=30.0, show_default=True,
              metavar="SECONDS",
              help="a client that sends nothing for this long loses what it holds")
@click.option("--max-body", type=int, default=1 << 20, show_default=True, metavar="BYTES",
              help="the largest message body (native API)")
@click.option("--threads", type=int, default=64, show_default=True,
              help="thread pool for blocking queue calls")
@click.option("--loop", type=click.Choice(["asyncio", "uvloop", "auto"]), default="asyncio",
              show_default=True,
              help="event loop (uvloop if installed; auto: uvloop when installed; see "
                   "README for why asyncio is the default)")
@click.option("--max-queue-length", type=int, default=5000, show_default=True,
              help="Sasquatch's API: most messages per queue (QueueFull past it)")
@click.option("--max-message-size", type=int, default=256, show_default=True, metavar="KB",
              help="Sasquatch's API: largest message body in KB (1-10240)")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="an .ini config file (see --generate-config); options given on the "
                   "command line override it")
@click.option("--generate-config", is_flag=True,
              help="print a commented default config file and exit")
@click.option("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
@click.option("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
@click.option("--auth", "auth_file", metavar="FILE",
              help="clients, secrets and rights per queue (JSON; see docs/service.md)")
@click.option("--insecure", is_flag=True,
              help="listen on a non-loopback address without TLS and auth anyway")
@click.option("--client-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, metavar="SECONDS",
              help="a connection idle or stalled in a request's headers or body for this "
                   "long is closed")
@click.option("--max-idle-connections", type=click.IntRange(min=0), default=0,
              show_default=True, metavar="N",
              help="most connections that have sent no request yet (with --auth: not "
                   "authenticated yet); one beyond is closed at once (0: from the "
                   "descriptor limit)")
@click.option("--max-idle-per-address", type=click.IntRange(min=0), default=0,
              show_default=True, metavar="N",
              help="the same, per client address (0: from the descriptor limit)")
@click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="SECONDS",
              help="a new connection that sends no complete request for this long is closed")
@click.pass_context
def serve(ctx, path, memory, host, port, socket_path, durability, lease_timeout, max_body,
          threads, loop, **more):
    """Serve the queues of the file PATH (created if missing), or in memory with --memory,
    over HTTP until SIGTERM or Ctrl-C.

    \b
    Example:
      ackqueue serve jobs.fs --port 8080
    """
    from ..service.config import apply_config
    options = apply_config(ctx, dict(path=path, memory=memory, host=host, port=port,
                                     socket_path=socket_path, durability=durability,
                                     lease_timeout=lease_timeout, max_body=max_body,
                                     threads=threads, loop=loop, **more))
    path, memory = _check_serve_options(options)
    try:
        from ..service.main import serve as run_service
    except ImportError as exc:
        raise click.UsageError(f"the queue service needs aiohttp ({exc}): "
                               "pip install 'ackqueue[service]'") from None
    from ..service.auth import Refused, prepare
    try:
        ssl_context, auth = prepare(options["host"], options.pop("tls_cert", None),
                                    options.pop("tls_key", None),
                                    options.pop("auth_file", None),
                                    options.pop("insecure", False))
    except Refused as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = run_service(None if memory else path, options["host"], options["port"],
                           socket_path=options["socket_path"],
                           durability=options["durability"],
                           lease_timeout=options["lease_timeout"],
                           pool_size=options["threads"], max_body=options["max_body"],
                           loop=options["loop"],
                           client_timeout=options.pop("client_timeout", 60.0),
                           sasquatch=options.get("sasquatch"), ssl_context=ssl_context,
                           auth=auth, max_idle_connections=options["max_idle_connections"],
                           max_idle_per_address=options["max_idle_per_address"],
                           header_timeout=options["header_timeout"],
                           share_file=options.get("share_file", False))
    except socket.gaierror as exc:      # one line, never a traceback
        raise CommandError(f"--host {options['host']}: no address found for this host "
                           f"name ({exc.strerror}); give a name or address of this "
                           "machine, e.g. 127.0.0.1") from None
    except (AckQueueError, OSError) as exc:
        raise CommandError(one_line(exc)) from None
    sys.exit(code)


# -- looking --------------------------------------------------------------------------------

@cli.command("ls")
@click.argument("target")
@json_option
@user_errors
def ls_(target, as_json):
    """List every queue of TARGET with its counts (changes nothing).

    \b
    Example:
      ackqueue ls jobs.fs
      ackqueue ls zeo://127.0.0.1:8100 --json
    """
    with Target(target) as t:
        catalog = t.catalog()
    if as_json:
        echo_json({name: {k: info[k] for k in ("kind", "ready", "in_flight", "delayed")}
                   for name, info in catalog.items()})
        return
    if not catalog:
        click.echo(f"no queues in {target}")
        return
    table([[name, info["kind"], info["ready"], info["in_flight"], info["delayed"]]
           for name, info in sorted(catalog.items())],
          ["QUEUE", "KIND", "READY", "IN FLIGHT", "DELAYED"], right={2, 3, 4})


@cli.command()
@click.argument("target")
@click.argument("queue")
@json_option
@user_errors
def stats(target, queue, as_json):
    """Show QUEUE's counts and lifetime totals (changes nothing).

    \b
    Example:
      ackqueue stats jobs.fs jobs
    """
    with Target(target) as t:
        result = t.queue(queue).stats()
    if as_json:
        echo_json(result)
        return
    width = max(map(len, result))
    for name, value in result.items():
        click.echo(f"{name.ljust(width)}  {value}")


@cli.command()
@click.argument("target")
@click.argument("queue")
@click.option("-n", "count", type=click.IntRange(min=0), default=10, show_default=True,
              help="how many messages to show")
@json_option
@user_errors
def peek(target, queue, count, as_json):
    """Show QUEUE's first messages: ready ones in delivery order, then delayed, then in
    flight, with decoded bodies, attributes, receive counts and ages.  Nothing changes: no
    receive is counted, nothing is claimed.

    \b
    Example:
      ackqueue peek jobs.fs jobs -n 3
    """
    with Target(target) as t:
        q = t.queue(queue)
        now = time.time()
        records = []
        it = q.browse()
        try:
            for m in it:
                if len(records) >= count:
                    break
                records.append((m, message_record(m, now)))
        finally:
            it.close()
    if as_json:
        echo_json([r for _, r in records])
        return
    if not records:
        click.echo(f"queue {queue!r} is empty")
        return
    for m, r in records:
        extra = ""
        if "delay" in r:
            extra = f"  ready in {output.seconds(r['delay'])}"
        if m.deadline is not None:
            extra = f"  deadline in {output.seconds(m.deadline - now)}"
        click.echo(f"#{r['id']}  {r['state']}  priority {r['priority']}  received "
                   f"{r['receive_count']}x  age {output.seconds(r['age'])}{extra}")
        if r["attributes"]:
            click.echo("  attributes: " + ", ".join(f"{k}={v}" for k, v in
                                                    sorted(r["attributes"].items())))
        click.echo("  body: " + describe(m.item))


def describe(item, limit=200):
    """An item for people: a str as itself, anything else as its repr (shortened)."""
    text = item if isinstance(item, str) else repr(item)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- moving ---------------------------------------------------------------------------------

@cli.command()
@click.argument("target")
@click.argument("queue")
@click.argument("body", required=False)
@click.option("--jsonl", "jsonl", type=click.File("r", encoding="utf-8"),
              help="put one message per JSON line of this file ('-': stdin): body, "
                   "attributes, priority, delay (see export)")
@click.option("--priority", type=int, default=None, help="priority 0-1000 (default 100)")
@click.option("--delay", type=float, default=None, help="seconds before it becomes ready")
@click.option("--attribute", "-a", "attributes", multiple=True, metavar="KEY=VALUE",
              help="a message attribute (repeatable)")
@user_errors
def put(target, queue, body, jsonl, priority, delay, attributes):
    """Put BODY (a text message) into QUEUE, or one message per line of stdin with '-',
    or the messages of a JSON-lines file with --jsonl.  The file and the queue are
    created if missing.

    \b
    Example:
      ackqueue put jobs.fs jobs "send invoice 42" -a customer=7
      printf 'a\\nb\\n' | ackqueue put jobs.fs jobs -
      ackqueue put jobs.fs jobs --jsonl messages.jsonl
    """
    if (body is None) == (jsonl is None):
        raise click.UsageError("give a BODY, '-' (lines of stdin) or --jsonl FILE")
    options = {}
    if priority is not None:
        options["priority"] = priority
    if delay is not None:
        options["delay"] = delay
    if attributes:
        pairs = {}
        for pair in attributes:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--attribute")
            pairs[key] = value
        options["attributes"] = pairs
    with Target(target, create=True) as t:
        q = t.queue(queue, must_exist=False)
        if jsonl is not None:
            n = put_lines(q, jsonl, None, "putting")
        elif body == "-":
            n = put_lines(q, sys.stdin, options, "putting")
        else:
            q.put(body, **options)
            n = 1
    click.echo(f"put {n} message{'s' if n != 1 else ''} into {queue!r}")


def put_lines(q, stream, options, description, total=None):
    """Put the messages of stream (text lines with options, or JSON lines when options is
    None) into q, IMPORT_BATCH per commit; returns how many.  A bad JSON line stops the
    command before anything of its batch is put; the error says how many were put.
    total: the number of lines, for the progress bar (None: unknown)."""
    done = 0
    batch = []

    def flush():
        nonlocal done
        # One commit per batch: in a file, one ZODB commit; through the queue service, one
        # atomic batch request (ackqueue.remote.block), all or nothing, in file order.
        with q.transaction():
            for item, opts in batch:
                q.put(item, **opts)
        done += len(batch)
        batch.clear()

    with Progress(description, total=total) as bar:
        for number, line in enumerate(stream, 1):
            if options is None:
                if not line.strip():
                    bar.advance()
                    continue
                try:
                    batch.append(parse_line(line, number))
                except BadLine as exc:
                    raise CommandError(f"{exc}; {done} message(s) before it were put, "
                                       "none from its batch on") from None
            else:
                batch.append((line.rstrip("\n").rstrip("\r"), options))
            if len(batch) >= IMPORT_BATCH:
                flush()
                bar.advance(IMPORT_BATCH)
        if batch:
            n = len(batch)
            flush()
            bar.advance(n)
    return done


def count_lines(path):
    """The number of lines of a file (for import's progress bar), read in 1 MiB blocks."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


@cli.command()
@click.argument("target")
@click.argument("queue")
@click.option("--ack", is_flag=True, help="acknowledge it: the message leaves the queue")
@json_option
@user_errors
def get(target, queue, ack, as_json):
    """Receive QUEUE's next ready message and print it.  Without --ack it is NOT
    acknowledged: it goes back to the queue, at its place, when this command ends (its
    receive count grows by one); with --ack it leaves the queue for good.

    \b
    Example:
      ackqueue get jobs.fs jobs --ack
    """
    import queue as stdlib_queue
    with Target(target) as t:
        q = t.queue(queue)
        try:
            m = q.get_message(block=False)
        except stdlib_queue.Empty:
            m = None
        if m is not None and ack:
            q.ack(m)
        record = None
        if m is not None:
            from .transfer import encode_body
            stored = None if isinstance(m.body, (str, bytes)) else pickle.dumps(m.body)
            body, encoding = encode_body(m.body, stored)
            record = {"id": int(m.id), "body": body, "priority": m.priority,
                      "attributes": dict(m.attributes), "receive_count": m.receive_count,
                      "age": round(max(0.0, time.time() - m.sent_at), 3), "acked": ack}
            if encoding:
                record["encoding"] = encoding
    if as_json:
        echo_json(record)
    elif m is None:
        click.echo(f"queue {queue!r} has no ready message")
    else:
        click.echo(f"#{int(m.id)}  priority {m.priority}  received {m.receive_count}x")
        if m.attributes:
            click.echo("  attributes: " + ", ".join(f"{k}={v}" for k, v in
                                                    sorted(m.attributes.items())))
        click.echo("  body: " + describe(m.body))
    if m is not None and not ack:
        click.echo("not acknowledged: given back to the queue now that this command ends "
                   "(use --ack to remove it)", err=True)


@cli.command()
@click.argument("target")
@click.argument("queue")
@user_errors
def purge(target, queue):
    """Remove every message of QUEUE: ready, delayed and in flight (a later ack of a
    purged delivery is refused).

    \b
    Example:
      ackqueue purge jobs.fs jobs
    """
    with Target(target) as t:
        q = t.queue(queue)
        total = sum(q.counts().values())
        with Progress(f"purging {total:,} messages", total=None):
            n = q.purge()
    click.echo(f"purged {n} message{'s' if n != 1 else ''} from {queue!r}")


@cli.command()
@click.argument("target")
@click.argument("dlq")
@click.option("--to", "to", metavar="QUEUE",
              help="move them all to this queue (default: the queue each came from)")
@user_errors
def redrive(target, dlq, to):
    """Move the ready messages of the dead-letter queue DLQ back to the queue each came
    from (or to --to QUEUE), where they start a new receive count.

    \b
    Example:
      ackqueue redrive jobs.fs jobs-dead
      ackqueue redrive jobs.fs jobs-dead --to jobs-retry
    """
    with Target(target) as t:
        q = t.queue(dlq)
        n = q.redrive(to=to)
    click.echo(f"redrove {n} message{'s' if n != 1 else ''} from {dlq!r}"
               + (f" to {to!r}" if to else ""))


@cli.command()
@click.argument("target")
@user_errors
def pack(target):
    """Pack TARGET's storage: acknowledged messages and old revisions go, the file
    shrinks.  Through a server or the queue service, it packs its file while the queues
    stay in use.

    \b
    Example:
      ackqueue pack jobs.fs
      ackqueue pack http://127.0.0.1:8080
    """
    with Target(target) as t:
        with Progress("packing", total=None, unit="bytes"):
            report = t.pack()
    if report.size_before is not None and report.size_after is not None:
        click.echo(f"packed {target}: {report.size_before:,} -> {report.size_after:,} "
                   f"bytes in {report.seconds:.2f} s")
    else:
        click.echo(f"packed {target} in {report.seconds:.2f} s")


# -- copying --------------------------------------------------------------------------------

@cli.command()
@click.argument("target")
@click.argument("queue")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@user_errors
def export(target, queue, file):
    """Copy every message of QUEUE (ready, delayed and in flight; nothing changes) to
    FILE as JSON lines ('-': stdout).  Each line keeps the body, attributes, priority,
    remaining delay and remaining retention; a str body is written as text, bytes as
    base64 with "encoding": "base64", any other item as base64 of its pickle with
    "encoding": "pickle".

    \b
    Example:
      ackqueue export jobs.fs jobs backlog.jsonl
    """
    with Target(target) as t:
        q = t.queue(queue)
        total = sum(q.counts().values())
        now = time.time()
        n = 0
        out = click.open_file(file, "w", encoding="utf-8", atomic=file != "-")
        with out, Progress("exporting", total=total) as bar:
            it = q.browse()
            try:
                for m in it:
                    out.write(json.dumps(message_record(m, now, q.kind),
                                         ensure_ascii=False, separators=(",", ":")) + "\n")
                    n += 1
                    bar.advance()
            finally:
                it.close()
    click.echo(f"exported {n} message{'s' if n != 1 else ''} from {queue!r}"
               + ("" if file == "-" else f" to {file}"), err=file == "-")


@cli.command("import")
@click.argument("target")
@click.argument("queue")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@user_errors
def import_(target, queue, file):
    """Put the messages of FILE (JSON lines, as export writes them; '-': stdin) into
    QUEUE, with their attributes, priorities, remaining delays and retention; the file
    and the queue are created if missing.  Messages are put 500 per commit.

    \b
    Example:
      ackqueue import other.fs jobs backlog.jsonl
    """
    total = None if file == "-" else count_lines(file)
    with Target(target, create=True) as t:
        stream = click.open_file(file, "r", encoding="utf-8")
        with stream:
            lines = stream
            if file == "-":
                lines = list(stream)
                first = next((line for line in lines if line.strip()), "")
            else:
                with open(file, encoding="utf-8") as peek:
                    first = next((line for line in peek if line.strip()), "")
            # A missing queue is made with the kind the export recorded.
            q = t.queue(queue, must_exist=False, kind=queue_kind_of(first))
            stream = lines
            if q.kind == store.LIFO:
                # The file lists messages in delivery order, newest first for a LIFO
                # queue: put them oldest first, so that they are delivered as they were.
                stream = list(stream)[::-1]
            n = put_lines(q, stream, None, "importing", total=total)
    click.echo(f"imported {n} message{'s' if n != 1 else ''} into {queue!r}")


def main(argv=None):
    """Run the command line; returns its exit code (click's standalone mode exits)."""
    try:
        cli.main(args=argv, prog_name="ackqueue", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        click.echo(code, err=True)
        return EXIT_ERROR
    return 0


@cli.command()
@click.argument("path")
@json_option
@user_errors
def check(path, as_json):
    """Read every transaction and data record of the queue file PATH (a FileStorage
    file) and report damage with its byte offset, changing nothing: the file is opened
    read-only, and may be checked while another process holds it.  Exits 1 on damage.

    \b
    Example:
      ackqueue check jobs.fs
    """
    import os
    from .check import check_file
    if path.startswith(("zeo://", "http://", "https://")):
        raise click.UsageError("check reads a file: run it where the server's file is")
    if os.path.isdir(path):
        raise CommandError(f"{path!r} is a directory, not a queue file")
    if not os.path.exists(path):
        raise CommandError(f"no queue file at {path!r}")
    with Progress("checking", total=os.path.getsize(path), unit="bytes") as bar:
        report = check_file(path, lambda offset: bar.update(completed=offset))
    if as_json:
        echo_json(report.as_dict())
    else:
        click.echo(f"{path}: {report.size:,} bytes, {report.transactions:,} transactions, "
                   f"{report.records:,} records read")
        for d in report.damage:
            click.echo(f"damage at offset {d.offset}: {d.what}")
        if report.zeros_after:
            click.echo(f"then {report.zeros_after:,} bytes of zeros: space written ahead "
                       "of its commits by a process that had it open (not data; the next "
                       "open cuts them)")
        click.echo("ok: no damage found" if report.ok else
                   f"DAMAGED: {len(report.damage)} problem(s) found; the file was not "
                   "changed")
    if not report.ok:
        sys.exit(EXIT_ERROR)


@cli.command()
@click.argument("target")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="seconds between refreshes")
@click.option("--iterations", "-n", type=click.IntRange(min=1), default=None,
              help="stop after this many refreshes (default: until q or Ctrl-C)")
@user_errors
def top(target, interval, iterations):
    """A live view of every queue of TARGET: ready, in flight and delayed counts, and
    in/out rates (messages put or moved in, and acknowledged, dead-lettered, expired or
    purged, per second, over the last 10 s), refreshed each second.  Quit with q or Ctrl-C.  When the output
    is not a terminal, a plain table is printed at each refresh instead.

    \b
    Example:
      ackqueue top zeo://127.0.0.1:8100
    """
    from .top import run_top
    with Target(target) as t:
        run_top(t, target, interval, iterations)
