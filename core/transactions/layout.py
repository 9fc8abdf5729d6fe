"""How transactions are written into the log: half-message headers and operation records.

Nothing here does I/O; :mod:`core.transactions.service` appends, :mod:`core.transactions.recovery`
replays. Two system queues hold everything (RocketMQ's RMQ_SYS_TRANS_HALF_TOPIC and
RMQ_SYS_TRANS_OP_HALF_TOPIC are the model):

``__half/0`` (written by the log's dispatcher): every half message, i.e. a record appended to its
own topic with ``FLAG_HALF``. It is durable but indexed only here, so no reader of a user topic
(gateway or Spark) can see it. The service adds these headers after the producer's own::

    x-braid-txn               transaction id (UTF-8)
    x-braid-producer-group    producer group, whose check-back callback is asked (UTF-8)
    x-braid-txn-timeout-ms    decimal; present only when the transaction has its own timeout

The ``x-braid-`` prefix is the broker's: a committed record keeps these headers (it is the same
frame), and a front end strips them before handing it to a client if it wants to.

``__transactions/0`` (written by the service): one OPERATION record per decision (a commit's is
also its LINK, below)::

    field     contents
    key       transaction id (UTF-8)
    client    producer group
    tags      [op kind]: "commit", "rollback" or "check" (tag filters skip kinds without reads)
    headers   x-braid-txn-resume   b"<half offset> <op offset>": replay may start there (below)
              x-braid-txn-reason   why, when not the client's call: "check-back",
                                   "timeout", "max-checks"
              x-braid-txn-checks   decimal check count so far (check ops only; RocketMQ's
                                   TRANSACTION_CHECK_TIMES)
    body      commit and rollback: the transaction's halves as repeated ``u64 position,
              u32 size`` -- exactly the body of the LINK that commits them; check: empty

A COMMIT is ONE frame: a LINK record (``FLAG_LINK | FLAG_LINK_INDEXED``, topic
``__transactions``, queue 0) whose body names every half of the transaction and whose key, client,
tags and headers are the op record's fields above. The log's dispatcher indexes it in
``__transactions/0`` (where replay reads it as the decision) and indexes each half at its own
destinations (where readers see the half itself: the LINK's headers are not laid over it), all
in one dispatch of one frame. A crash keeps the whole frame or none of it, so "decided but not
visible" and "visible but not decided" cannot happen, and a commit costs one append.

Commits of several transactions in one event-loop turn (many producers committing at once)
share ONE such frame: its body names the halves of all of them, its key is empty, its client
is empty, and header ``x-braid-txn-ids`` lists the transactions it decides (each id as ``u16
length`` + UTF-8). One append, one index entry and one checksum then serve them all, and they
become visible together. A frame deciding one transaction keeps the layout above.

A ROLLBACK and a CHECK are plain op records.

Resume mark: every op record names the offsets in ``__half/0`` and ``__transactions/0`` from
which a replay sees every transaction still open after that op record: the oldest open
transaction's first half, and the end of ``__transactions/0`` when it stored that half (with none
open: both queue ends). The op record itself is always at or after its mark's op offset, and a
commit op names its halves in its body, so replay finds a commit decided just before a crash even
though the mark no longer counts it. Restart reads the mark of the last op record: its cost is
bounded by the oldest open transaction, not by the age of the log.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.log import record as rec

TXN_HEADER = "x-braid-txn"
PRODUCER_GROUP_HEADER = "x-braid-producer-group"
TIMEOUT_HEADER = "x-braid-txn-timeout-ms"
RESUME_HEADER = "x-braid-txn-resume"
REASON_HEADER = "x-braid-txn-reason"
CHECKS_HEADER = "x-braid-txn-checks"
TXN_IDS_HEADER = "x-braid-txn-ids"
# Headers the broker adds to a half message; everything else is the producer's.
HALF_HEADERS = frozenset((TXN_HEADER, PRODUCER_GROUP_HEADER, TIMEOUT_HEADER))

# Operation kinds (the op record's only tag).
OP_COMMIT = "commit"
OP_ROLLBACK = "rollback"
OP_CHECK = "check"
OP_KINDS = (OP_COMMIT, OP_ROLLBACK, OP_CHECK)

# Why an outcome was chosen.
REASON_CLIENT = "client"  # the producer (or a front end on its behalf) said so
REASON_CHECK_BACK = "check-back"  # the producer's answer to a check-back
REASON_TIMEOUT = "timeout"  # no check-back for this group: the default outcome after a timeout
REASON_MAX_CHECKS = "max-checks"  # every check answered unknown: the default outcome


@dataclass(frozen=True, slots=True)
class ResumeMark:
    """Replay reads ``__half/0`` from ``half_offset`` and ``__transactions/0`` from
    ``op_offset``: every half below ``half_offset`` belongs to a decided transaction, and every
    op record that replay needs is at or after ``op_offset``."""

    half_offset: int
    op_offset: int

    def encode(self) -> bytes:
        return f"{self.half_offset} {self.op_offset}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> ResumeMark:
        half, op = raw.split()
        return cls(int(half), int(op))


@dataclass(frozen=True, slots=True)
class HalfInfo:
    """The transaction headers of a half message."""

    txn_id: str
    producer_group: str
    timeout_ms: float | None


def half_headers(
    txn_id: str, producer_group: str, timeout_ms: float | None
) -> list[tuple[str, bytes]]:
    headers = [(TXN_HEADER, txn_id.encode()), (PRODUCER_GROUP_HEADER, producer_group.encode())]
    if timeout_ms is not None:
        headers.append((TIMEOUT_HEADER, str(int(timeout_ms)).encode()))
    return headers


def _encoded_name(name: str) -> bytes:
    """A header's name as :func:`core.log.record.encode_headers` writes it (its value follows)."""
    raw = name.encode()
    return len(raw).to_bytes(2, "little") + raw


_TXN_NAME = _encoded_name(TXN_HEADER)
_RESUME_NAME = _encoded_name(RESUME_HEADER)
_TXN_IDS_NAME = _encoded_name(TXN_IDS_HEADER)


def _encoded_value(value: bytes) -> bytes:
    return len(value).to_bytes(4, "little") + value


def encode_half_headers(txn_id: str, encoded_group: bytes) -> bytes:
    """:func:`half_headers`, encoded: the transaction id header, then ``encoded_group`` (the
    rest, see :func:`encode_group_headers`), which a producer group's transactions share."""
    raw = txn_id.encode()
    return _TXN_NAME + len(raw).to_bytes(4, "little") + raw + encoded_group


def encode_group_headers(producer_group: str, timeout_ms: float | None) -> bytes:
    """The half headers after the transaction id, encoded (computed once per group)."""
    return rec.encode_headers(half_headers("", producer_group, timeout_ms)[1:])


def encode_op_headers(mark: tuple[int, int], reason: str | None, checks: int | None) -> bytes:
    """:func:`op_headers`, encoded, from the mark's ``(half offset, op offset)``: a commit
    writes one per transaction."""
    value = b"%d %d" % mark
    encoded = _RESUME_NAME + len(value).to_bytes(4, "little") + value
    if (reason is not None and reason != REASON_CLIENT) or checks is not None:
        encoded += rec.encode_headers(op_headers(ResumeMark(0, 0), reason, checks)[1:])
    return encoded


def encode_txn_ids_header(txn_ids: list[bytes]) -> bytes:
    """Header ``x-braid-txn-ids`` of a commit deciding several transactions, encoded (it
    follows the op headers, see :func:`encode_op_headers`); ``txn_ids`` are UTF-8."""
    value = b"".join([len(txn_id).to_bytes(2, "little") + txn_id for txn_id in txn_ids])
    return _TXN_IDS_NAME + len(value).to_bytes(4, "little") + value


def decode_txn_ids(value: bytes) -> tuple[str, ...]:
    """The transaction ids of header ``x-braid-txn-ids``."""
    ids: list[str] = []
    at = 0
    while at < len(value):
        size = int.from_bytes(value[at : at + 2], "little")
        at += 2
        if at + size > len(value):
            raise ValueError("x-braid-txn-ids is truncated")
        ids.append(value[at : at + size].decode())
        at += size
    return tuple(ids)


def half_info(headers: list[tuple[str, bytes]]) -> HalfInfo | None:
    """The transaction a half message belongs to; None if it carries no ``x-braid-txn`` (a half
    message some other component wrote)."""
    txn_id: str | None = None
    group = ""
    timeout: float | None = None
    for name, value in headers:
        if name == TXN_HEADER:
            txn_id = value.decode()
        elif name == PRODUCER_GROUP_HEADER:
            group = value.decode()
        elif name == TIMEOUT_HEADER:
            timeout = float(value)
    return None if txn_id is None else HalfInfo(txn_id, group, timeout)


def user_headers(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """A record's headers without the ones the transaction service added."""
    return [(name, value) for name, value in headers if name not in HALF_HEADERS]


def op_headers(mark: ResumeMark, reason: str | None, checks: int | None) -> list[tuple[str, bytes]]:
    headers = [(RESUME_HEADER, mark.encode())]
    if reason is not None and reason != REASON_CLIENT:  # absent: the client decided
        headers.append((REASON_HEADER, reason.encode()))
    if checks is not None:
        headers.append((CHECKS_HEADER, str(checks).encode()))
    return headers


@dataclass(frozen=True, slots=True)
class Operation:
    """One decoded op record."""

    position: int
    end: int
    kind: str
    txn_id: str
    producer_group: str
    mark: ResumeMark | None
    reason: str | None
    checks: int
    body: bytes
    # Every transaction the record decides: (txn_id,), or those of a commit of several.
    txn_ids: tuple[str, ...] = ()


def decode_operation(
    position: int,
    size: int,
    key: bytes | None,
    client: str,
    tags: list[str],
    headers: list[tuple[str, bytes]],
    body: bytes | None,
) -> Operation | None:
    """The op record's meaning; None for a record of ``__transactions/0`` that is not one."""
    kind = next((tag for tag in tags if tag in OP_KINDS), None)
    if kind is None or key is None:
        return None
    mark: ResumeMark | None = None
    reason: str | None = None
    checks = 0
    txn_id = key.decode()
    txn_ids: tuple[str, ...] = (txn_id,)
    for name, value in headers:
        if name == RESUME_HEADER:
            mark = ResumeMark.decode(value)
        elif name == REASON_HEADER:
            reason = value.decode()
        elif name == CHECKS_HEADER:
            checks = int(value)
        elif name == TXN_IDS_HEADER and kind == OP_COMMIT:
            txn_ids = decode_txn_ids(value)
    return Operation(
        position,
        position + size,
        kind,
        txn_id,
        client,
        mark,
        reason,
        checks,
        body or b"",
        txn_ids,
    )
