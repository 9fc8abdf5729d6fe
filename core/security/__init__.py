"""Security: one user store, one permission model and one authorization service for every
protocol (issue 18; docs/security.md).

- :mod:`core.security.passwords`: argon2id hashes, RabbitMQ's sha256/sha512 hashes checked;
- :mod:`core.security.scram`: SCRAM-SHA-256/512 credentials (Kafka);
- :mod:`core.security.model`: users, vhost and topic permissions, Kafka ACLs;
- :mod:`core.security.store`: all of it durable in the system topic ``__security``;
- :mod:`core.security.mapping`: which resource and permission each protocol operation needs
  (the table docs/security.md prints);
- :mod:`core.security.authorizer`: the one decision;
- :mod:`core.security.throttle`, :mod:`core.security.audit`: logins under attack;
- :mod:`core.security.service`: logins and decisions for the gateways (through the Broker
  API, ``core/api/security.py``) and the changes the management API makes.
"""

from core.security.config import SecurityConfig
from core.security.service import LoginResult, ScramLogin, SecurityError, SecurityService
from core.security.store import SECURITY_TOPIC, SecurityStore

__all__ = [
    "SECURITY_TOPIC",
    "LoginResult",
    "ScramLogin",
    "SecurityConfig",
    "SecurityError",
    "SecurityService",
    "SecurityStore",
]
