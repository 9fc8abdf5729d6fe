"""The AMQP listener in process, for tests that also reach the broker behind its API."""

from __future__ import annotations

from core.api import BrokerAPI, Clock
from core.broker import Node
from gateway.amqp.server import AMQPServer
from gateway.amqp.session import SessionSettings


class ServerUnderTest(AMQPServer):
    """An ``AMQPServer`` over ``BrokerAPI(broker)``, keeping ``broker`` for the test to inspect
    and drive (flow control, records stored, transactions): only gateway code is held to the
    API."""

    def __init__(
        self, broker: Node, settings: SessionSettings | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(BrokerAPI(broker), settings, clock=clock)
        self.broker = broker
