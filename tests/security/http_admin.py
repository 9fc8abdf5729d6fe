"""The RabbitMQ-style HTTP API of a running broker, as the security tests drive it (users,
permissions and topic permissions set as guest, the administrator allowed from loopback)."""

from __future__ import annotations

import base64
import json
import urllib.request

TIMEOUT_S = 30.0


class Admin:
    """The RabbitMQ-style HTTP API of the broker, as guest (administrator, from loopback)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api"
        self.auth = "Basic " + base64.b64encode(b"guest:guest").decode()

    def _send(self, method: str, path: str, body: dict[str, str] | None = None) -> None:
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"authorization": self.auth, "content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            assert response.status < 300

    def user(self, name: str, password: str) -> None:
        self._send("PUT", f"/users/{name}", {"password": password, "tags": ""})

    def permit(self, user: str, configure: str = "", write: str = "", read: str = "") -> None:
        body = {"configure": configure, "write": write, "read": read}
        self._send("PUT", f"/permissions/%2F/{user}", body)

    def topic_permit(self, user: str, exchange: str, write: str, read: str) -> None:
        body = {"exchange": exchange, "write": write, "read": read}
        self._send("PUT", f"/topic-permissions/%2F/{user}", body)
