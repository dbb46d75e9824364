"""``ackqueue serve --config FILE`` and ``--generate-config``: Sasquatch's .ini config file.

The format is Sasquatch's: ``key = value`` lines, optional ``[section]`` headers (a key is
matched by its name whatever its section), ``#`` or ``;`` comments, also after a value.
Every error of a file (unknown key, duplicate key, bad or out-of-range value, a line that
is not ``key = value``) is listed, one line each, and the service does not start (exit 2,
nothing opened).  Options given on the command line override the file; the file overrides
the built-in defaults.
"""
import sys
from dataclasses import dataclass

import click

__all__ = ["KEYS", "SasquatchSettings", "parse", "load", "generate", "apply_config",
           "ConfigError"]


class ConfigError(Exception):
    def __init__(self, errors):
        super().__init__("\n".join(errors))
        self.errors = errors


def _int(text):
    return int(text.strip())


def _float(text):
    value = float(text.strip())
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return value


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def _bool(text):
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError("not true/false/yes/no/1/0")


def _str(text):
    return text.strip()


def _choice(*choices):
    def parse(text):
        t = text.strip()
        if t not in choices:
            raise ValueError(f"not one of {', '.join(choices)}")
        return t
    return parse


# (section, key, parser, default, low, high, comment, option name in serve()).  Ranges are
# Sasquatch's (its README's config reference), with the service's own keys beside them.
KEYS = [
    ("server", "port", _int, 8080, 0, 65535, "0-65535 (0 picks a free port)", "port"),
    ("server", "host", _str, "127.0.0.1", None, None, "address to listen on", "host"),
    ("server", "memory", _bool, False, None, None, "true/false/yes/no/1/0", "memory"),
    ("server", "socket", _str, "", None, None, "also serve on this Unix socket (empty: no)",
     "socket_path"),
    ("server", "share_file", _bool, False, None, None, "true/false: also serve processes "
     "that open the file itself, on FILE.sock", "share_file"),
    ("server", "durability", _choice("fsync", "os"), "fsync", None, None,
     "fsync or os (a queue file's commits)", "durability"),
    ("server", "lease_timeout", _float, 30.0, 0.001, 86400, "seconds, native API client "
     "leases", "lease_timeout"),
    ("server", "threads", _int, 64, 1, 1024, "1-1024, thread pool for queue calls",
     "threads"),
    ("server", "max_body", _int, 1 << 20, 1, 1 << 30, "bytes, native API message body",
     "max_body"),
    ("server", "loop", _choice("asyncio", "uvloop", "auto"), "asyncio", None, None,
     "asyncio, uvloop or auto", "loop"),
    ("server", "max_idle_connections", _int, 0, 0, None, "unauthenticated idle "
     "connections (0: from ulimit -n)", "max_idle_connections"),
    ("server", "max_idle_per_address", _int, 0, 0, None, "the same, per client address "
     "(0: from ulimit -n)", "max_idle_per_address"),
    ("server", "header_timeout", _float, 10.0, 0.001, 3600, "seconds for a new "
     "connection's first request", "header_timeout"),
    ("queue", "max_queue_length", _int, 5000, 1, None, ">= 1", "max_queue_length"),
    ("queue", "max_message_size_kb", _int, 256, 1, 10240, "1-10240", "max_message_size"),
    ("queue", "max_request_body_size_kb", _int, 1024, 1, None, ">= 1", None),
    ("queue", "default_visibility_timeout", _int, 30, 0, 43200, "0-43200 seconds", None),
    ("queue", "default_max_receives", _int, 4, 1, 10, "1-10", None),
    ("queue", "poison_max_receives", _int, 100, 1, None, ">= default_max_receives", None),
    ("queue", "default_retention_period", _int, 345600, 60, 1209600,
     "60-1209600 seconds (4 days default)", None),
    ("queue", "default_wait_time_seconds", _int, 20, 0, 20, "0-20", None),
    ("queue", "default_dedup_time_period", _int, 300, 1, 43200,
     "1-43200 seconds (5 min default)", None),
    ("queue", "default_priority", _int, 100, 0, 1000, "0-1000", None),
    ("cleanup", "poison_cleanup_interval", _int, 60, 1, None, "seconds, >= 1", None),
    ("cleanup", "retention_cleanup_interval", _int, 600, 1, None, "seconds, >= 1", None),
    ("cleanup", "dedup_cleanup_interval", _int, 60, 1, None, "seconds, >= 1", None),
    ("database", "reader_pool_size", _int, 4, 1, 64, "1-64", None),
]
_BY_KEY = {k[1]: k for k in KEYS}


@dataclass
class SasquatchSettings:
    """What Sasquatch's API applies to its requests (defaults: Sasquatch's)."""
    max_queue_length: int = 5000
    max_message_size_kb: int = 256
    max_request_body_size_kb: int = 1024
    default_visibility_timeout: int = 30
    default_max_receives: int = 4
    poison_max_receives: int = 100
    default_retention_period: int = 345600
    default_wait_time_seconds: int = 20
    default_dedup_time_period: int = 300
    default_priority: int = 100


def parse(text, where="config"):
    """{key: value} of a config file's text; ConfigError listing every error."""
    values, lines, errors = {}, {}, []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]") or not line[1:-1].strip():
                errors.append(f"{where}:{number}: a section header is [name], not {line!r}")
            continue
        for mark in (" #", "\t#", " ;", "\t;"):
            cut = line.find(mark)
            if cut >= 0:
                line = line[:cut].rstrip()
        if "=" not in line:
            errors.append(f"{where}:{number}: not 'key = value': {line!r}")
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        spec = _BY_KEY.get(key)
        if spec is None:
            errors.append(f"{where}:{number}: unknown key {key!r}")
            continue
        if key in lines:
            errors.append(f"{where}:{number}: duplicate key {key!r} (first on line "
                          f"{lines[key]})")
            continue
        lines[key] = number
        _, _, parser, _, low, high, comment, _ = spec
        try:
            v = parser(value)
        except ValueError as exc:
            errors.append(f"{where}:{number}: {key} = {value!r} is invalid ({exc}); "
                          f"expected {comment}")
            continue
        if (low is not None and v < low) or (high is not None and v > high):
            errors.append(f"{where}:{number}: {key} = {value} is out of range ({comment})")
            continue
        values[key] = v
    dmr = values.get("default_max_receives", _BY_KEY["default_max_receives"][3])
    pmr = values.get("poison_max_receives")
    if pmr is not None and pmr < dmr:
        errors.append(f"{where}:{lines['poison_max_receives']}: poison_max_receives = {pmr} "
                      f"is under default_max_receives ({dmr})")
    if errors:
        raise ConfigError(errors)
    return values


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read the config file ({exc})"]) from None
    return parse(text, path)


def _show(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def generate():
    """A commented config file with every key at its default (loads back unchanged)."""
    out = ["# ackqueue serve --config FILE: Sasquatch's config keys and the service's own.",
           "# Section headers are optional: a key is matched by its name. Command-line",
           "# options override this file. Unknown, duplicate or out-of-range keys are",
           "# refused at start, every error listed."]
    section = None
    for sec, key, _, default, _, _, comment, _ in KEYS:
        if sec != section:
            out += ["", f"[{sec}]"]
            section = sec
        left = f"{key} = {_show(default)}"
        out.append(f"{left:<37}# {comment}" if _show(default) else f"{left}  # {comment}")
    return "\n".join(out) + "\n"


def apply_config(ctx, options):
    """serve's options with --config's values under them (the command line wins), and
    options["sasquatch"], the SasquatchSettings.  Handles --generate-config (print, exit
    0) and a bad file (every error on stderr, exit 2)."""
    if options.pop("generate_config", False):
        click.echo(generate(), nl=False)
        ctx.exit(0)
    config_file = options.pop("config_file", None)
    values = {}
    if config_file is not None:
        try:
            values = load(config_file)
        except ConfigError as exc:
            for line in exc.errors:
                click.echo(f"ackqueue serve: {line}", err=True)
            click.echo(f"ackqueue serve: {len(exc.errors)} error(s) in the config file; "
                       "nothing was opened", err=True)
            sys.exit(2)

    def given(option):
        source = ctx.get_parameter_source(option)
        return source is not None and source.name == "COMMANDLINE"

    settings = SasquatchSettings()
    for _, key, _, _, _, _, _, option in KEYS:
        if key not in values:
            continue
        if option is None:
            if hasattr(settings, key):
                setattr(settings, key, values[key])
            continue
        param = {"socket_path": "socket_path", "max_message_size": "max_message_size"}.get(
            option, option)
        if not given(param):
            value = values[key]
            if option == "socket_path" and not value:
                value = None
            options[option] = value
    if "max_queue_length" in options:
        settings.max_queue_length = options.pop("max_queue_length")
    if "max_message_size" in options:
        settings.max_message_size_kb = options.pop("max_message_size")
    errors = []
    if settings.max_queue_length < 1:
        errors.append(f"max_queue_length = {settings.max_queue_length} is out of range "
                      "(>= 1)")
    if not 1 <= settings.max_message_size_kb <= 10240:
        errors.append(f"max_message_size = {settings.max_message_size_kb} is out of range "
                      "(1-10240 KB)")
    if errors:
        raise click.UsageError("; ".join(errors))
    options["sasquatch"] = settings
    if options.get("path") is not None and options.get("memory") and values.get("memory") \
            and not given("memory"):
        options["memory"] = False        # a PATH on the command line beats memory = true
    return options
