"""The HTTP listener of ``braid serve``, on aiohttp, on the broker's own event loop.

Why aiohttp (and not Starlette on uvicorn): it runs on the loop the broker already runs
(uvloop) as a plain ``loop.create_server`` site, with no second server framework or ASGI layer
between the socket and the handler, keeps HTTP/1.1 keep-alive and pipelining, serves HTTPS from
a stdlib ``ssl.SSLContext`` (the same one the other TLS listeners share, so a SIGHUP reload
reaches it too), and its client is what the tests drive it with. It replaces the hand-written
``braid/http.py``.

- :mod:`braid.web.server`: :class:`WebServer` (start, address, close), the response counter
  behind ``braid_http_responses_total``;
- :mod:`braid.web.operations`: ``/health`` and ``/metrics`` (open, as RabbitMQ's Prometheus
  port is);
- :mod:`braid.web.auth`: HTTP Basic auth against the user store for everything else;
- :mod:`braid.web.management`: users and permissions the RabbitMQ way (``/api/users``,
  ``/api/permissions``, ``/api/topic-permissions``, ``/api/whoami``).
"""

from braid.web.operations import HealthCheck
from braid.web.server import WebServer, build_app

__all__ = ["HealthCheck", "WebServer", "build_app"]
