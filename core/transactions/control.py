"""Half messages from every protocol: RocketMQ's transactional producer as a record convention.

:class:`~core.transactions.TransactionService` is the mechanism (Kafka transactions and AMQP
``tx`` run on it); this module lets any producer use it directly, by headers and two topics,
the same way from Kafka, AMQP and MQTT 5 (record headers == AMQP ``headers`` == MQTT 5 user
properties, docs/mapping.md). :class:`HalfMessages` is created once per shard
(``core/broker/shard.py``); the node routes every publish through it when it carries the
half-message header or goes to ``braid.txn``.

Half message
    A publish carrying header ``x-braid-txn-id: <id>`` (the producer's transaction id) is stored
    as a half message of that transaction instead of a plain record: durable, invisible, with
    the destinations a plain publish would have reached (bindings, route hooks). More halves
    may join the transaction from any connection until it is decided; the first one opens it,
    with ``x-braid-producer-group: <group>`` (default ``default``; the group is asked on
    check-back) and optionally ``x-braid-txn-timeout-ms`` (the check timeout of this
    transaction). These three headers are not stored on the half (the service adds its own).
    A Kafka batch is one half message (the first record carrying the header names the
    transaction; uncompressed batches only, as for ``x-delay`` and ``x-braid-tags``).

Outcome (from any connection)
    A publish to topic ``braid.txn`` (AMQP exchange ``braid.txn``, MQTT topic
    ``braid.txn/<id>``, Kafka topic ``braid.txn``) whose body is ``commit``, ``rollback`` or
    ``unknown`` (case-insensitive; RocketMQ's ``COMMIT_MESSAGE``, ``ROLLBACK_MESSAGE`` and
    ``UNKNOW`` too) decides the transaction named by its ``x-braid-txn-id`` header, else by its
    subject (AMQP routing key, MQTT levels after ``braid.txn``, Kafka record key). It is applied
    first (a commit is durable when the publish is acknowledged), then stored in ``braid.txn``
    like any record, with header ``x-braid-txn-result`` saying what happened: ``committed``,
    ``rolled_back``, ``unknown`` (noted: the transaction stays open), or ``error: <why>`` (an
    unknown transaction, a decided one, a body that is no outcome). An error also refuses the
    publish (``PublishResult.refused``: an AMQP publisher confirm is a nack) and is logged.

Check-back
    A transaction undecided ``check_timeout_ms`` after its last half is checked back: the
    broker publishes a check request to topic ``braid.txn.check`` with subject = the producer
    group (AMQP: a queue bound to exchange ``braid.txn.check`` with key ``<group>``; MQTT:
    subscription ``braid.txn.check/<group>``; Kafka: topic ``braid.txn.check``, key
    ``<group>``). It carries the first half's body and user headers (RocketMQ hands
    checkLocalTransaction the message), the transaction id as correlation id (AMQP
    ``correlation_id``, MQTT 5 Correlation Data, Kafka header ``x-braid-correlation-id``) and in
    headers ``x-braid-txn-id`` / ``x-braid-producer-group`` (Kafka shows them; AMQP and MQTT
    hide ``x-braid-*`` headers of records they did not publish, hence the correlation id). The
    producer answers by publishing the outcome as above; no answer within
    ``check_call_timeout_ms`` counts as ``unknown``. After ``max_checks`` unknown checks the
    service's default outcome (rollback, RocketMQ's) applies.

In the service, transaction ids and producer groups of this convention are ``half:<id>`` and
``half:<group>`` (so committed records carry ``x-braid-txn: half:<id>``): a producer can
neither reach a Kafka or AMQP transaction through ``braid.txn`` nor collide with their ids.
Everything is in the log (the service's ``__half``/``__transactions``), so a pending half can be
committed after a restart and its check-backs continue.

Not thread-safe: use from the event-loop thread that runs the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from core.delivery.message import (
    BATCH_SELECT_HEADER,
    EXPIRES_AT_HEADER,
    ROUTING_KEY_HEADER,
    inner_subject,
)
from core.errors import TopicError
from core.log import Record
from core.log import record as rec
from core.log.batches import batch_is_control, unpack_batch
from core.log.store import Appended
from core.transactions.layout import (
    PRODUCER_GROUP_HEADER,
    TIMEOUT_HEADER,
    TXN_HEADER,
)
from core.transactions.service import TransactionService
from core.transactions.state import (
    COMMIT,
    COMMITTED,
    OPEN,
    ROLLBACK,
    ROLLED_BACK,
    UNKNOWN,
    TransactionError,
)

log = logging.getLogger(__name__)

# The topics of the convention (plain topics, declared when the broker starts).
TXN_TOPIC = "braid.txn"
CHECK_TOPIC = "braid.txn.check"
CONTROL_TOPICS = frozenset((TXN_TOPIC, CHECK_TOPIC))

# Headers a producer sets (AMQP header, MQTT 5 user property, Kafka record header).
TXN_ID_HEADER = "x-braid-txn-id"
GROUP_HEADER = PRODUCER_GROUP_HEADER  # "x-braid-producer-group"
TXN_TIMEOUT_HEADER = TIMEOUT_HEADER  # "x-braid-txn-timeout-ms"
# What the broker adds to a stored outcome record.
RESULT_HEADER = "x-braid-txn-result"
# The check request's transaction id, as every protocol shows it (correlation id).
CORRELATION_HEADER = "x-braid-correlation-id"

DEFAULT_PRODUCER_GROUP = "default"
# The service's namespace for this convention's transactions and groups.
SERVICE_PREFIX = "half:"
MAX_ID_BYTES = 255

# Not stored on a half (the service writes its own transaction headers).
_HALF_REQUEST_HEADERS = frozenset((TXN_ID_HEADER, GROUP_HEADER, TXN_TIMEOUT_HEADER, TXN_HEADER))
# Not copied from the half into a check request: the convention's, the service's, and those
# that would change how the request is delivered (an AMQP publisher's property bytes override
# the correlation id; an expiry would drop it; a batch selection names other queues; an MQTT
# retain flag).
_NOT_IN_CHECK = _HALF_REQUEST_HEADERS | {
    "x-braid-amqp-properties",
    "x-mqtt-retain",
    CORRELATION_HEADER,
    EXPIRES_AT_HEADER,
    BATCH_SELECT_HEADER,
    ROUTING_KEY_HEADER,
}
_TXN_ID_BYTES = TXN_ID_HEADER.encode()
_COMPRESSED_OR_CONTROL = 0x07 | 0x20

# Outcome words (the body of a braid.txn record, stripped, case-insensitive).
_OUTCOMES = {
    "commit": COMMIT,
    "commit_message": COMMIT,
    "rollback": ROLLBACK,
    "rollback_message": ROLLBACK,
    "unknown": UNKNOWN,
    "unknow": UNKNOWN,
}
# Share of the service's check_call_timeout_ms a check waits for the producer's answer (the
# rest is left for publishing the request, so a silent producer reads as "unknown", not failed).
_ANSWER_WAIT_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class HalfMark:
    """What the headers of a publish say about its transaction."""

    txn_id: str
    producer_group: str
    timeout_ms: float | None


def _text(value: bytes | memoryview) -> str:
    return bytes(value).decode("utf-8", "replace").strip()


def _valid_id(what: str, value: str) -> str:
    if not value or len(value.encode()) > MAX_ID_BYTES:
        raise TopicError("invalid_txn", f"{what} must be 1..{MAX_ID_BYTES} bytes, not {value!r}")
    return value


def half_mark(headers: Sequence[tuple[str, bytes]]) -> HalfMark | None:
    """The transaction a publish's headers put it in; None for a plain publish. Raises
    TopicError (code ``invalid_txn``) for an empty or oversized id or a bad timeout."""
    for name, _ in headers:
        if name == TXN_ID_HEADER:
            break
    else:
        return None
    txn_id = ""
    group = DEFAULT_PRODUCER_GROUP
    timeout_ms: float | None = None
    for name, value in headers:
        if name == TXN_ID_HEADER:
            txn_id = _text(value)
        elif name == GROUP_HEADER:
            group = _text(value) or DEFAULT_PRODUCER_GROUP
        elif name == TXN_TIMEOUT_HEADER:
            try:
                timeout_ms = float(_text(value))
            except ValueError:
                timeout_ms = -1.0
            if not timeout_ms > 0:
                raise TopicError(
                    "invalid_txn", f"{TXN_TIMEOUT_HEADER} must be a positive number of ms"
                )
    return HalfMark(
        _valid_id("transaction id", txn_id), _valid_id("producer group", group), timeout_ms
    )


def batch_half_mark(batch: bytes | memoryview) -> HalfMark | None:
    """The transaction of a Kafka batch: the first record with ``x-braid-txn-id`` names it.
    Decoded only when the bytes contain the header name (uncompressed batches)."""
    # attributes (int16) at byte 21 of the batch header: bits 0-2 the compression codec, bit 5
    # the control flag. A compressed batch is not searched (nor copied).
    if int.from_bytes(batch[21:23], "big") & _COMPRESSED_OR_CONTROL:
        return None
    raw = batch if type(batch) is bytes else bytes(batch)
    if _TXN_ID_BYTES not in raw:
        return None
    for inner in unpack_batch(raw):
        mark = half_mark(inner.headers)
        if mark is not None:
            return mark
    return None


def parse_outcome(body: bytes | memoryview | None) -> str | None:
    """``commit`` / ``rollback`` / ``unknown`` from an outcome record's body; None if it is
    none of them."""
    if body is None:
        return None
    return _OUTCOMES.get(_text(body).lower())


def outcome_txn_id(headers: Sequence[tuple[str, bytes]], subject: str, key: bytes | None) -> str:
    """The transaction an outcome record names: header ``x-braid-txn-id``, else the subject,
    else the key."""
    for name, value in headers:
        if name == TXN_ID_HEADER:
            return _text(value)
    if subject:
        return subject
    return _text(key) if key else ""


class TopicNames(Protocol):
    def __contains__(self, name: str) -> bool: ...


class PublishingBroker(Protocol):
    """What :class:`HalfMessages` uses of the broker's ``Node`` (core.broker imports this
    module, so this one names the node by what it does rather than importing it)."""

    @property
    def topics(self) -> TopicNames: ...

    async def declare_topic(self, name: str) -> object: ...

    async def publish(
        self,
        topic: str,
        body: bytes | None,
        *,
        subject: str,
        headers: rec.Headers,
        client: str,
        address: str,
        create_topic: bool,
        wait_durable: bool,
    ) -> object: ...


class HalfMessages:
    """The convention over one broker's :class:`TransactionService` (``broker.transactions``).

    Construct it in the broker's constructor, after the service (which has replayed the log):
    it gives the producer groups of recovered transactions their check-back again."""

    def __init__(self, broker: PublishingBroker, service: TransactionService) -> None:
        self.broker = broker
        self.service = service
        self._groups: set[str] = set()  # service groups given our check-back
        # service txn id -> the running check-back's answer
        self._answers: dict[str, asyncio.Future[str]] = {}
        self.metrics: dict[str, int] = {
            "halves": 0,
            "outcomes": 0,
            "outcome_errors": 0,
            "check_requests": 0,
            "check_answers": 0,
        }
        for pending in service.pending():
            if pending.producer_group.startswith(SERVICE_PREFIX):
                self._register(pending.producer_group)

    async def declare_topics(self) -> None:
        """Make ``braid.txn`` and ``braid.txn.check`` exist (Kafka metadata, AMQP exchanges)."""
        for topic in (TXN_TOPIC, CHECK_TOPIC):
            if topic not in self.broker.topics:
                await self.broker.declare_topic(topic)

    def _register(self, service_group: str) -> None:
        if service_group not in self._groups:
            self._groups.add(service_group)
            self.service.set_check_back(service_group, self._check_back)

    # -- half messages ---------------------------------------------------------------------

    def add_half(
        self,
        mark: HalfMark,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        key: bytes | None,
        headers: rec.Headers,
        tags: Sequence[str],
        subject: str,
        client: str,
        address: str,
        destinations: Sequence[tuple[str, int]],
        protocol: int,
        born_ms: int,
        flags: int = 0,
        record_count: int = 1,
    ) -> Appended:
        """Append a half message to the transaction ``mark`` names, opening it if needed; not
        yet durable. ``destinations``: where a commit makes it visible (the topic's queue
        first)."""
        service_id = SERVICE_PREFIX + mark.txn_id
        if self.service.txn_state(service_id) != OPEN:
            group = SERVICE_PREFIX + mark.producer_group
            self._register(group)
            self.service.begin(group, service_id, timeout_ms=mark.timeout_ms)
        self.metrics["halves"] += 1
        kept = [(name, value) for name, value in headers if name not in _HALF_REQUEST_HEADERS]
        return self.service.add_nowait(
            service_id,
            topic,
            queue,
            body,
            key=key,
            headers=kept,
            tags=tags,
            subject=subject,
            client=client,
            address=address,
            destinations=destinations if len(destinations) > 1 else None,
            protocol=protocol,
            born_ms=born_ms,
            flags=flags,
            record_count=record_count,
        )

    # -- outcomes --------------------------------------------------------------------------

    async def apply(self, txn_id: str, body: bytes | memoryview | None) -> tuple[str, bool]:
        """Apply one outcome record: ``(result, ok)``, the result as ``x-braid-txn-result``
        stores it. A commit or rollback is durable when this returns."""
        self.metrics["outcomes"] += 1
        outcome = parse_outcome(body)
        if outcome is None:
            return self._error(txn_id, "the body must be commit, rollback or unknown")
        if not txn_id:
            return self._error(txn_id, f"no transaction id ({TXN_ID_HEADER} or subject)")
        service_id = SERVICE_PREFIX + txn_id
        answer = self._answers.get(service_id)
        if answer is not None and not answer.done():
            self.metrics["check_answers"] += 1
            answer.set_result(outcome)
        if outcome == UNKNOWN:
            state = self.service.txn_state(service_id)
            if state is None:
                return self._error(txn_id, "unknown transaction")
            return (UNKNOWN if state == OPEN else state), True
        try:
            if outcome == COMMIT:
                await self.service.commit(service_id)
            else:
                await self.service.rollback(service_id)
        except TransactionError as error:
            return self._error(txn_id, str(error).replace(SERVICE_PREFIX, ""))
        return (COMMITTED if outcome == COMMIT else ROLLED_BACK), True

    def _error(self, txn_id: str, why: str) -> tuple[str, bool]:
        self.metrics["outcome_errors"] += 1
        log.info("%s: outcome for transaction %r refused: %s", TXN_TOPIC, txn_id, why)
        return f"error: {why}", False

    async def apply_batch(self, batch: bytes | memoryview) -> tuple[str, bool]:
        """Apply every record of a Kafka batch published to ``braid.txn``, in order: the
        results joined by ``; `` and whether all were applied."""
        if batch_is_control(batch):
            return "", True
        results: list[str] = []
        ok = True
        for inner in unpack_batch(batch):
            subject = inner_subject(inner.key, inner.headers)
            txn_id = outcome_txn_id(inner.headers, subject, None)
            result, applied = await self.apply(txn_id, inner.value)
            results.append(result)
            ok = ok and applied
        return "; ".join(results), ok

    # -- check-back ------------------------------------------------------------------------

    async def _check_back(self, service_group: str, service_id: str, first: Record) -> str:
        """The service's check-back for our groups: publish a check request to
        ``braid.txn.check`` and wait for the producer's outcome record."""
        group = service_group.removeprefix(SERVICE_PREFIX)
        txn_id = service_id.removeprefix(SERVICE_PREFIX)
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._answers[service_id] = answer
        try:
            body, headers = check_request(first, txn_id, group)
            await self.broker.publish(
                CHECK_TOPIC,
                body,
                subject=group,
                headers=headers,
                client="braid",
                address=f"{CHECK_TOPIC}/{group}",
                create_topic=True,
                wait_durable=False,
            )
            self.metrics["check_requests"] += 1
            wait_s = self.service.check_call_timeout_ms * _ANSWER_WAIT_SHARE / 1000
            try:
                return await asyncio.wait_for(answer, wait_s)
            except TimeoutError:
                return UNKNOWN
        finally:
            if self._answers.get(service_id) is answer:
                del self._answers[service_id]


def check_request(first: Record, txn_id: str, group: str) -> tuple[bytes | None, rec.Headers]:
    """Body and headers of the check request for a transaction whose first half is ``first``
    (a Kafka batch half: its first record)."""
    body: bytes | None = first.body
    headers: list[tuple[str, bytes]] = first.headers
    if first.is_batch and first.body is not None:
        records = unpack_batch(first.body)
        if records:
            body = records[0].value
            headers = records[0].headers
    kept = [(name, value) for name, value in headers if name not in _NOT_IN_CHECK]
    return body, [
        (TXN_ID_HEADER, txn_id.encode()),
        (GROUP_HEADER, group.encode()),
        (CORRELATION_HEADER, txn_id.encode()),
        *kept,
    ]
