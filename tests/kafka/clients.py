"""Request frames exactly as the real clients put them on the wire, for the codec tests."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import struct
from typing import Any

import kafka.protocol
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.parser import KafkaProtocol


def kafka_python_request_classes() -> dict[int, Any]:
    """kafka-python 3.x request class per API key (its JSON-schema protocol package)."""
    classes: dict[int, Any] = {}
    for info in pkgutil.walk_packages(kafka.protocol.__path__, "kafka.protocol."):
        if ".old" in info.name or "generate" in info.name:
            continue
        module = importlib.import_module(info.name)
        members: list[tuple[str, Any]] = inspect.getmembers(module, inspect.isclass)
        for _, cls in members:
            if (
                issubclass(cls, ApiMessage)
                and cls is not ApiMessage
                and getattr(cls, "_json", None)
                and cls.is_request()
            ):
                classes[cls.API_KEY] = cls
    return classes


def kafka_python_frame(request: Any, correlation_id: int, client_id: str = "kafka-python") -> bytes:
    """One framed request through kafka-python's own sans-IO client (``KafkaProtocol``)."""
    protocol = KafkaProtocol(client_id=client_id)
    protocol.send_request(request, correlation_id=correlation_id)
    return bytes(protocol.send_bytes())


def aiokafka_frame(
    request: Any,
    versions: dict[int, tuple[int, int]],
    correlation_id: int,
    client_id: str | None = "aiokafka",
) -> bytes:
    """One framed request as ``aiokafka.conn.AIOKafkaConnection.send`` builds it."""
    request_struct = request.prepare(versions)
    header = request_struct.build_request_header(correlation_id=correlation_id, client_id=client_id)
    message: bytes = header.encode() + request_struct.encode()
    return struct.pack(">i", len(message)) + message
