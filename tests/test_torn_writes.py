"""Torn writes: a queue file cut at a byte offset (a power cut can leave a torn tail), or
with garbage after its end, opens and holds exactly the state after some prefix of the
committed transactions, with no partial message.

A child process builds the file with a seeded sequence of committed operations (puts,
get+ack, get+nack, task_done, transaction blocks committed and rolled back), records after
each durable one the file size and the expected queue content, and dies by SIGKILL holding
an item.  Each cut copy is made without the .index file, as after a power cut.

For a cut at byte c, let k be the last recorded state whose size is <= c: every commit up
to it is whole in the copy, and the commit of state k+2 starts after c, so the reopened
queue must hold state k or k+1 exactly.  Larger cuts never give earlier states.  After the
open, the copy must start with exactly the whole transactions of the cut (FileStorage
truncated the torn tail itself) and pass ZODB's fstest, and reopen with the same content.

ACKQUEUE_LONG=1 tries every offset instead of a seeded sample."""
import json
import logging
import os
import random
import signal
import struct

import pytest
from ZODB.scripts import fstest

import ackqueue.filestorage
from ackqueue import AckQueue, NotAQueueFile, StorageError
from helpers_reliability import LONG, drain_messages, run_child

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

SEED = 20240606
OPERATIONS = 40
SAMPLED_OFFSETS = 40
TRANS_HDR = ">8sQc"          # FileStorage transaction header: tid, length, status
TRANS_HDR_LEN = struct.calcsize(TRANS_HDR)

BUILD = """
    import json, os, random, signal, struct, sys
    from ackqueue import AckQueue

    path, seed, operations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    q = AckQueue(path=path)
    alive = []                 # ids of unacknowledged items, in put order
    padding = {}               # id -> length of its padding
    receives = {}              # id -> how many times it was received

    def data_end():
        # Where the whole transactions end (zeros written ahead follow them).
        data, pos = open(path, "rb").read(), 4
        while pos + 17 <= len(data):
            length = struct.unpack(">8sQc", data[pos:pos + 17])[1]
            if length < 17 or pos + length + 8 > len(data):
                break
            pos += length + 8
        return pos

    states = [[data_end(), []]]

    def durable():
        # A commit has returned: everything submitted so far is on disk.
        states.append([data_end(), list(alive)])

    def item(n):
        return f"item-{n}-" + "x" * padding[n]

    def new_item():
        n = len(padding)
        padding[n] = rng.choice([0, 30, 300, 1000])
        return n

    def get():
        x = q.get(block=False)
        n = int(x.split("-")[1])
        receives[n] = receives.get(n, 0) + 1
        assert n == alive[0], (n, alive)
        return n, x

    for step in range(operations):
        op = rng.choices(["put", "ack", "nack", "task_done", "commit", "rollback"],
                         weights=[6, 2, 1, 1, 2, 1])[0]
        if op != "put" and not alive:
            op = "put"
        if op == "put":
            n = new_item()
            q.put(item(n))
            alive.append(n)
            durable()
        elif op == "ack":
            n, x = get()
            q.ack(x)
            alive.remove(n)
            durable()
        elif op == "task_done":
            n, x = get()
            q.task_done()
            alive.remove(n)
            durable()
        elif op == "nack":
            n, x = get()
            q.nack(x)               # no change to what is unacknowledged
        elif op == "commit":
            with q.transaction():
                n, x = get()
                puts = [new_item() for _ in range(rng.randint(1, 3))]
                for p in puts:
                    q.put(item(p))
            alive.remove(n)
            alive.extend(puts)
            durable()
        else:
            try:
                with q.transaction():
                    n, x = get()
                    q.put(item(new_item()))
                    raise KeyError("roll back")
            except KeyError:
                pass                # nothing changed

    assert alive
    get()                           # dies holding the head: it must come back
    print(json.dumps({"states": states, "padding": padding, "receives": receives}),
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def txn_ends(data):
    """End offsets of the whole transaction records in a FileStorage file's bytes."""
    ends, pos = [], 4
    while pos + TRANS_HDR_LEN <= len(data):
        _, length, _ = struct.unpack(TRANS_HDR, data[pos:pos + TRANS_HDR_LEN])
        end = pos + length + 8
        if end > len(data) or length < TRANS_HDR_LEN:     # torn, or zeros after the end
            break
        ends.append(end)
        pos = end
    return ends


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The queue file's bytes and the states recorded while building it."""
    path = tmp_path_factory.mktemp("torn") / "source.fs"
    proc = run_child(BUILD, path, SEED, OPERATIONS)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    report = json.loads(proc.stdout)
    padding = {int(n): p for n, p in report["padding"].items()}

    def item(n):
        return f"item-{n}-" + "x" * padding[n]

    states = [(size, [item(n) for n in ids]) for size, ids in report["states"]]
    receives = {item(int(n)): count for n, count in report["receives"].items()}
    data = path.read_bytes()
    # The source is whole, then the zeros it wrote ahead of its commits (never closed).
    end = txn_ends(data)[-1]
    assert end < len(data) and data[end:] == bytes(len(data) - end)
    data = data[:end]
    assert states[-1][0] <= len(data)
    return data, states, receives


def open_copy(path, data):
    """Write data to path (nothing else: no .index, no .lock), as a power cut leaves it."""
    directory = os.path.dirname(path)
    base = os.path.basename(path)
    for name in os.listdir(directory):
        if name.startswith(base):
            os.remove(os.path.join(directory, name))
    with open(path, "wb") as f:
        f.write(data)


def read_queue(path, receives, reads=1):
    """Open the queue at path and return its items in order, checking it is consistent
    (reads: how many times this copy has been read, this one included)."""
    with AckQueue(path=path) as q:
        size, unfinished = q.qsize(), q.unfinished_tasks
        messages = drain_messages(q)
        bodies = [m.body for m in messages]
        assert size == unfinished == len(bodies), (size, unfinished, len(bodies))
        for m in messages:
            # A receive count is at most what the builder received, plus our reads.
            assert 1 <= m.receive_count <= receives.get(m.body, 0) + reads, m
    return bodies


def matching_state(bodies, states, candidates):
    for k in candidates:
        if 0 <= k < len(states) and states[k][1] == bodies:
            return k
    return None


def check_cut(tmp_path, data, states, receives, cut):
    """Open a copy of data cut at byte cut; return the index of the state it holds."""
    path = str(tmp_path / "cut.fs")
    open_copy(path, data[:cut])
    bodies = read_queue(path, receives)

    k = max([0] + [i for i, (size, _) in enumerate(states) if size <= cut])
    found = matching_state(bodies, states, [k, k + 1])
    assert found is not None, (
        f"cut at {cut} of {len(data)}: the queue holds {summary(bodies)}, which is neither "
        f"state {k} {summary(states[k][1])} nor state {k + 1}")

    # FileStorage dropped the torn tail itself: the copy starts with exactly the whole
    # transactions of the cut, and whatever the queue wrote since is well formed.
    whole = max([4] + [end for end in txn_ends(data) if end <= cut]) if cut >= 4 else 0
    after = open(path, "rb").read()
    assert after[:whole] == data[:whole]
    if whole > 4:
        assert whole in txn_ends(after), f"cut at {cut}: the tail after {whole} was kept"
    fstest.check(path)

    # And it opens again with the same content (what the recovery wrote is durable).
    assert read_queue(path, receives, reads=2) == bodies
    return found


def summary(bodies):
    """Item ids, for messages (the bodies themselves are long)."""
    return [int(b.split("-")[1]) for b in bodies]


def offsets(data):
    if LONG:
        return [0] + list(range(4, len(data) + 1))
    rng = random.Random(SEED)
    chosen = set(rng.sample(range(4, len(data) + 1), SAMPLED_OFFSETS))
    ends = txn_ends(data)
    chosen.update(rng.sample(ends, 5))                  # exactly at a commit's end
    chosen.update(end - 1 for end in rng.sample(ends, 5))   # one byte short of it
    chosen.update([0, 4, len(data)])
    return sorted(chosen)


def test_cut_file_opens_with_a_prefix_of_committed_transactions(tmp_path, built):
    data, states, receives = built
    seen = []
    for cut in offsets(data):
        seen.append((cut, check_cut(tmp_path, data, states, receives, cut)))
    found = [k for _, k in seen]
    assert found == sorted(found), f"a longer cut gave an earlier state: {seen}"
    assert seen[-1] == (len(data), len(states) - 1)    # the whole file: the last state
    assert len(set(found)) > 5                          # the cuts did land all over it


def test_cut_inside_the_header_is_refused_and_left_untouched(tmp_path, built):
    """1 to 3 bytes (a power cut while the file was being created): not a FileStorage."""
    data, _, _ = built
    path = str(tmp_path / "header.fs")
    for cut in (1, 2, 3):
        open_copy(path, data[:cut])
        with pytest.raises(NotAQueueFile):
            AckQueue(path=path)
        assert open(path, "rb").read() == data[:cut]


def test_unfinished_commit_at_the_tail_is_dropped(tmp_path, built):
    """A commit written whole but not marked finished (status 'c': the process died
    between writing it and the final fsync) is dropped: the state is the one before it."""
    data, states, receives = built
    ends = [4] + txn_ends(data)
    rng = random.Random(SEED + 1)
    for i in sorted(rng.sample(range(len(ends) - 1), 8)) + [len(ends) - 2]:
        start, end = ends[i], ends[i + 1]
        torn = bytearray(data[:end])
        assert torn[start + 16:start + 17] == b" "
        torn[start + 16:start + 17] = b"c"
        path = str(tmp_path / "unfinished.fs")
        open_copy(path, bytes(torn))
        bodies = read_queue(path, receives)
        open_copy(str(tmp_path / "before.fs"), data[:start])
        assert bodies == read_queue(str(tmp_path / "before.fs"), receives), i
        fstest.check(path)


def garbage_bytes(rng, n, tid=None, status=None):
    """n random bytes; tid and status, if given, replace the bytes where a transaction
    header would have its id (bytes 0-7) and status (byte 16)."""
    garbage = bytearray(rng.getrandbits(8) for _ in range(n))
    if tid is not None:
        garbage[0:8] = tid
    if status is not None:
        garbage[16] = status
    return bytes(garbage)


FUTURE_TID = b"\x7f" + b"\0" * 7       # later than any transaction in the file
PAST_TID = b"\0" * 7 + b"\1"           # earlier than every transaction in the file
ASCII_STATUS = b" upcx"
# Garbage of 23+ bytes whose first 8 bytes are an older transaction id than the file's
# last one (zeros, as a power cut can leave) failed the first open with ReadConflictError
# (ZODB's read_index truncates it but keeps its tid as the last one), and garbage whose
# byte 16 (a header's status) is not ASCII failed every open (UnicodeDecodeError):
# ackqueue.torn_tail cuts such tails before ZODB reads the file.
GARBAGE = [pytest.param(lambda rng, n=n: garbage_bytes(rng, n), id=f"random{n}")
           for n in (1, 7, 22)]
GARBAGE += [pytest.param(lambda rng, n=n: b"\0" * n, id=f"zeros{n}") for n in (1, 8, 22)]
GARBAGE += [pytest.param(
    lambda rng, n=n: garbage_bytes(rng, n, FUTURE_TID, rng.choice(ASCII_STATUS)),
    id=f"random{n}-future-tid") for n in (23, 24, 100, 5000)]
GARBAGE += [pytest.param(lambda rng, n=n: b"\0" * n, id=f"zeros{n}") for n in (23, 4096)]
GARBAGE += [pytest.param(
    lambda rng, n=n: garbage_bytes(rng, n, PAST_TID, rng.choice(ASCII_STATUS)),
    id=f"random{n}-past-tid") for n in (23, 5000)]
GARBAGE += [pytest.param(
    lambda rng, n=n: garbage_bytes(rng, n, FUTURE_TID, rng.randrange(0x80, 0x100)),
    id=f"random{n}-non-ascii-status") for n in (23, 5000)]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_after_the_end_is_dropped(tmp_path, built, garbage):
    """What a crash can leave after the last commit (random bytes of a half-written block,
    zeros of a size extended before its data) is dropped: the file opens with the last
    committed state."""
    data, states, receives = built
    rng = random.Random(SEED)
    path = str(tmp_path / "garbage.fs")
    for trial in range(3):
        open_copy(path, data + garbage(rng))
        assert read_queue(path, receives) == states[-1][1]
        after = open(path, "rb").read()
        assert after[:len(data)] == data
        fstest.check(path)
        assert read_queue(path, receives, reads=2) == states[-1][1]


def test_cut_tail_is_kept_beside_the_file_with_a_warning(tmp_path, built, caplog):
    data, states, receives = built
    path = str(tmp_path / "tail.fs")
    torn = garbage_bytes(random.Random(SEED), 100, FUTURE_TID, ord("c")) + b"\0" * 50
    open_copy(path, data + torn)
    with caplog.at_level(logging.WARNING, logger="ackqueue.torn_tail"):
        assert read_queue(path, receives) == states[-1][1]
    kept = [n for n in os.listdir(tmp_path) if n.startswith("tail.fs.torn-")]
    assert len(kept) == 1
    assert (tmp_path / kept[0]).read_bytes() == torn
    assert any(path in r.getMessage() and kept[0] in r.getMessage() for r in caplog.records)


def test_zeros_alone_after_the_end_are_cut_without_a_copy(tmp_path, built, caplog):
    """Zeros after the last transaction (what a queue file that was not closed keeps
    written ahead of its commits) hold nothing: cut, with no torn copy and no warning."""
    data, states, receives = built
    path = str(tmp_path / "ahead.fs")
    open_copy(path, data + b"\0" * ackqueue.filestorage.AHEAD)
    with caplog.at_level(logging.INFO, logger="ackqueue.torn_tail"):
        assert read_queue(path, receives) == states[-1][1]
    assert not [n for n in os.listdir(tmp_path) if ".torn-" in n]
    after = open(path, "rb").read()
    assert after[:len(data)] == data
    assert txn_ends(after)[-1] == len(after)        # closed: no zeros after its end
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("zeros" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("damage", ["status", "length"])
def test_damage_in_the_middle_is_refused_then_repaired(tmp_path, built, damage):
    """A damaged header with whole transactions after it is never cut silently: the open
    names the offset and the repair; repair() cuts there, keeping the rest beside."""
    data, states, receives = built
    ends = [4] + txn_ends(data)
    start = ends[len(ends) // 2]
    damaged = bytearray(data)
    if damage == "status":
        damaged[start + 16] = 0xff
    else:
        damaged[start + 8:start + 16] = struct.pack(">Q", 10 ** 9)
    path = str(tmp_path / "middle.fs")
    open_copy(path, bytes(damaged))
    with pytest.raises(StorageError, match=f"damaged at byte {start}.*repair"):
        AckQueue(path=path)
    assert open(path, "rb").read() == bytes(damaged)        # left as it is
    assert not os.path.exists(path + ".lock")

    kept = ackqueue.filestorage.repair(path)
    assert open(kept, "rb").read() == bytes(damaged[start:])
    assert open(path, "rb").read() == data[:start]
    open_copy(str(tmp_path / "before.fs"), data[:start])
    assert read_queue(path, receives) == read_queue(str(tmp_path / "before.fs"), receives)
    fstest.check(path)


def test_repair_option_of_the_queue(tmp_path, built):
    data, states, receives = built
    ends = [4] + txn_ends(data)
    start = ends[-3]
    damaged = bytearray(data)
    damaged[start:start + 8] = b"\0" * 8                    # an older transaction id
    path = str(tmp_path / "option.fs")
    open_copy(path, bytes(damaged))
    with pytest.raises(StorageError, match=f"byte {start}"):
        AckQueue(path=path)
    with AckQueue(path=path, repair=True) as q:
        assert q.qsize() >= 0
    assert open(path, "rb").read()[:start] == data[:start]
