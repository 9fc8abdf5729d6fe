"""Limits on counts and sizes, decided once for every protocol (issue 21 item 1, docs/limits.md):
the ``[limits]`` settings (:mod:`core.limits.config`), RabbitMQ's per-user and per-vhost limits
(:mod:`core.limits.store`) and the decisions (:mod:`core.limits.service`). Gateways reach it
only through the Broker API (``core/api/limits.py``)."""

from core.limits.config import LimitsConfig as LimitsConfig
from core.limits.service import QUEUE_VHOST_KEY as QUEUE_VHOST_KEY
from core.limits.service import ConnectionCounts as ConnectionCounts
from core.limits.service import LimitRefusal as LimitRefusal
from core.limits.service import LimitsService as LimitsService
from core.limits.service import count_queues as count_queues
from core.limits.store import LimitError as LimitError
from core.limits.store import LimitsStore as LimitsStore
