"""Transactional half messages (RocketMQ semantics), the base of Kafka transactions and AMQP tx.

:class:`TransactionService` stores each record of a transaction as an invisible HALF record,
commits all of them at once with one LINK record, or rolls them back; an outcome left unknown is
asked of the producer (check-back) a bounded number of times, then a default applies. Everything
is in the log (``__half/0``, ``__transactions/0``), so open transactions survive restart. Modules:

- ``service``: :class:`TransactionService`.
- ``decisions``: a commit decision as one LINK frame (:class:`DecisionWriter`).
- ``layout``: half-message headers and op records as they are stored.
- ``recovery``: rebuilding open transactions on start; finding missing commit LINKs.
- ``state``: :class:`Transaction`, the state names, :class:`TransactionError`.
"""

from core.transactions.layout import (
    PRODUCER_GROUP_HEADER,
    TXN_HEADER,
    user_headers,
)
from core.transactions.service import (
    DEFAULT_CHECK_TIMEOUT_MS,
    DEFAULT_MAX_CHECKS,
    CheckBack,
    TransactionService,
)
from core.transactions.state import (
    COMMIT,
    COMMITTED,
    OPEN,
    ROLLBACK,
    ROLLED_BACK,
    UNKNOWN,
    PendingTransaction,
    TransactionError,
)

__all__ = [
    "COMMIT",
    "COMMITTED",
    "DEFAULT_CHECK_TIMEOUT_MS",
    "DEFAULT_MAX_CHECKS",
    "OPEN",
    "PRODUCER_GROUP_HEADER",
    "ROLLBACK",
    "ROLLED_BACK",
    "TXN_HEADER",
    "UNKNOWN",
    "CheckBack",
    "PendingTransaction",
    "TransactionError",
    "TransactionService",
    "user_headers",
]
