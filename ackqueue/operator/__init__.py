"""The operator's command line: ``ackqueue COMMAND TARGET ...`` (see commands.py).

One module per concern: targets (opening a file or a zeo:// server, exit codes and
errors), output (tables, JSON, progress bars), transfer (export and import as JSON
lines), check (reading a FileStorage file for damage), top (the live view)."""
