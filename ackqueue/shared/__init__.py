"""One queue file opened by many processes (``AckQueue(path="jobs.fs")`` in each).

The process that holds the file (its first opener) serves it to the others over a Unix
socket beside it: ``owner`` (the server, in the holder's process), ``client`` (the other
processes' proxies, the remote drop-in over the lean wire), ``wire`` (the framing),
``files`` (where the socket is, and whether a holder shares its file), ``holding`` (a
client process taking a file over when its owner has gone).
"""
