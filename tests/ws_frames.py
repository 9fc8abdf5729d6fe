"""Client WebSocket frames (RFC 6455 §5.2) for tests that speak MQTT over WebSocket by hand:
masked as a client must, or unmasked (``mask=None``) as a broken client sends them."""

from __future__ import annotations

DEFAULT_MASK = b"\x37\xfa\x21\x3d"


def client_frame(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bytes | None = DEFAULT_MASK
) -> bytes:
    size = len(payload)
    head = bytes(((0x80 if fin else 0) | opcode,))
    masked_bit = 0x80 if mask is not None else 0
    if size < 126:
        head += bytes((masked_bit | size,))
    elif size < 65536:
        head += bytes((masked_bit | 126,)) + size.to_bytes(2, "big")
    else:
        head += bytes((masked_bit | 127,)) + size.to_bytes(8, "big")
    if mask is None:
        return head + payload
    # One big-integer XOR instead of a Python loop per byte: the CPU tests send MiB-sized frames.
    key = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        size, "little"
    )
    return head + mask + masked
