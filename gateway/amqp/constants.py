"""AMQP 0-9-1 wire constants: frame types, class/method ids, reply codes, limits.

Sources: the AMQP 0-9-1 specification (amqp0-9-1.xml, section 4.2 "Protocol Grammar") and
RabbitMQ's reader (``rabbit_reader.erl``) and content assembler (``rabbit_command_assembler.erl``),
whose behaviour on bad input BraidMQ copies so that clients see the errors they already know.
"""

from __future__ import annotations

from typing import Final

# --- protocol header -------------------------------------------------------------------------

# The 8 bytes a client sends first: "AMQP", 0, then major 0, minor 9, revision 1 (spec 4.2.2).
PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
# The AMQP 0-9 header; RabbitMQ accepts it and speaks 0-9-1 (rabbit_reader:version_negotiation).
PROTOCOL_HEADER_0_9: Final = b"AMQP\x01\x01\x00\x09"
PROTOCOL_HEADER_SIZE: Final = 8

# --- frames (spec 4.2.3) ---------------------------------------------------------------------
#
#   0      1         3             7                  size+7  size+8
#   +------+---------+-------------+  +------------+  +-----------+
#   | type | channel |    size     |  |  payload   |  | frame-end |
#   +------+---------+-------------+  +------------+  +-----------+
#    octet   short       long          size octets        0xCE

FRAME_METHOD: Final = 0x01
FRAME_HEADER: Final = 0x02  # content header
FRAME_BODY: Final = 0x03  # content body
FRAME_HEARTBEAT: Final = 0x08  # 0-9-1 moved it from 4 (0-8) to 8
FRAME_END: Final = 0xCE

FRAME_HEADER_SIZE: Final = 7  # type + channel + size
FRAME_OVERHEAD: Final = 8  # header + frame-end: frame_max counts these too (spec 4.2.3)

# Before Connection.Tune-Ok the peer must not send frames larger than this (spec 4.2.3,
# "frame-min-size"); RabbitMQ's reader starts with frame_max = ?FRAME_MIN_SIZE.
FRAME_MIN_SIZE: Final = 4096
# RabbitMQ's default frame_max offered in Connection.Tune (rabbit.app: frame_max = 131072).
DEFAULT_FRAME_MAX: Final = 131072
# RabbitMQ lets a frame's payload exceed frame_max - 8 by up to 8 octets, "since quite a few
# [clients] get it wrong - off-by 1 or 8" (rabbit_reader ?FRAME_SIZE_FUDGE). So the payload
# limit is frame_max itself; one octet more is a 501 frame error.
FRAME_SIZE_FUDGE: Final = FRAME_OVERHEAD

# A content body larger than this is a connection error 501 whatever the configuration
# (rabbit_command_assembler, ?MAX_MSG_SIZE = 512 MiB).
MAX_MSG_SIZE: Final = 512 * 1024 * 1024
# Default per-message limit of a decoder made without one; above it the channel is closed with
# 406 PRECONDITION_FAILED (rabbit_channel check_msg_size). RabbitMQ 3.x's 128 MiB (4.0 lowered
# it to 16 MiB); a session takes [limits] max_message_size (core/limits/config.py) instead.
DEFAULT_MAX_MESSAGE_SIZE: Final = 128 * 1024 * 1024

HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"

# --- classes and methods (spec 1.x; ids as in amqp0-9-1.xml) -----------------------------------

CLASS_CONNECTION: Final = 10
CLASS_CHANNEL: Final = 20
CLASS_EXCHANGE: Final = 40
CLASS_QUEUE: Final = 50
CLASS_BASIC: Final = 60
CLASS_CONFIRM: Final = 85
CLASS_TX: Final = 90

BASIC_QOS: Final = 10
BASIC_CONSUME: Final = 20
BASIC_CANCEL: Final = 30
BASIC_PUBLISH: Final = 40
BASIC_RETURN: Final = 50
BASIC_DELIVER: Final = 60
BASIC_GET: Final = 70
BASIC_GET_OK: Final = 71
BASIC_GET_EMPTY: Final = 72
BASIC_ACK: Final = 80
BASIC_REJECT: Final = 90
BASIC_RECOVER_ASYNC: Final = 100
BASIC_RECOVER: Final = 110
BASIC_NACK: Final = 120


def method_index(class_id: int, method_id: int) -> int:
    """The 32-bit (class id << 16 | method id) that starts a method frame's payload."""
    return (class_id << 16) | method_id


INDEX_BASIC_PUBLISH: Final = method_index(CLASS_BASIC, BASIC_PUBLISH)
INDEX_BASIC_ACK: Final = method_index(CLASS_BASIC, BASIC_ACK)
INDEX_BASIC_NACK: Final = method_index(CLASS_BASIC, BASIC_NACK)
INDEX_BASIC_REJECT: Final = method_index(CLASS_BASIC, BASIC_REJECT)

# Bits of the last octet of Basic.Publish / Ack / Nack / Reject.
PUBLISH_MANDATORY: Final = 0x01
PUBLISH_IMMEDIATE: Final = 0x02
ACK_MULTIPLE: Final = 0x01
NACK_MULTIPLE: Final = 0x01
NACK_REQUEUE: Final = 0x02
REJECT_REQUEUE: Final = 0x01

# Methods a client may send (the spec's <chassis name="server" implement="MUST"/> entries, plus
# RabbitMQ's Connection.Update-Secret, Basic.Nack and Confirm.Select). A known method outside
# this set arriving from a client is 503 COMMAND_INVALID ("unimplemented method",
# rabbit_channel:handle_method fallback).
CLIENT_METHODS: Final = frozenset(
    method_index(c, m)
    for c, m in (
        (CLASS_CONNECTION, 11),  # Start-Ok
        (CLASS_CONNECTION, 21),  # Secure-Ok
        (CLASS_CONNECTION, 31),  # Tune-Ok
        (CLASS_CONNECTION, 40),  # Open
        (CLASS_CONNECTION, 50),  # Close
        (CLASS_CONNECTION, 51),  # Close-Ok
        (CLASS_CONNECTION, 70),  # Update-Secret
        (CLASS_CHANNEL, 10),  # Open
        (CLASS_CHANNEL, 20),  # Flow
        (CLASS_CHANNEL, 21),  # Flow-Ok
        (CLASS_CHANNEL, 40),  # Close
        (CLASS_CHANNEL, 41),  # Close-Ok
        (CLASS_EXCHANGE, 10),  # Declare
        (CLASS_EXCHANGE, 20),  # Delete
        (CLASS_EXCHANGE, 30),  # Bind
        (CLASS_EXCHANGE, 40),  # Unbind
        (CLASS_QUEUE, 10),  # Declare
        (CLASS_QUEUE, 20),  # Bind
        (CLASS_QUEUE, 30),  # Purge
        (CLASS_QUEUE, 40),  # Delete
        (CLASS_QUEUE, 50),  # Unbind
        (CLASS_BASIC, BASIC_QOS),
        (CLASS_BASIC, BASIC_CONSUME),
        (CLASS_BASIC, BASIC_CANCEL),
        (CLASS_BASIC, BASIC_PUBLISH),
        (CLASS_BASIC, BASIC_GET),
        (CLASS_BASIC, BASIC_ACK),
        (CLASS_BASIC, BASIC_REJECT),
        (CLASS_BASIC, BASIC_RECOVER_ASYNC),
        (CLASS_BASIC, BASIC_RECOVER),
        (CLASS_BASIC, BASIC_NACK),
        (CLASS_CONFIRM, 10),  # Select
        (CLASS_TX, 10),  # Select
        (CLASS_TX, 20),  # Commit
        (CLASS_TX, 30),  # Rollback
    )
)

# --- reply codes (spec 1.1 "Constants"; soft = channel error, hard = connection error) ---------

REPLY_SUCCESS: Final = 200
CONTENT_TOO_LARGE: Final = 311  # soft
NO_ROUTE: Final = 312  # Basic.Return for an unroutable mandatory message
NO_CONSUMERS: Final = 313  # soft
CONNECTION_FORCED: Final = 320  # hard
INVALID_PATH: Final = 402  # hard
ACCESS_REFUSED: Final = 403  # soft
NOT_FOUND: Final = 404  # soft
RESOURCE_LOCKED: Final = 405  # soft
PRECONDITION_FAILED: Final = 406  # soft
FRAME_ERROR: Final = 501  # hard: a frame the recipient could not decode
SYNTAX_ERROR: Final = 502  # hard: illegal values for one or more fields
COMMAND_INVALID: Final = 503  # hard: an invalid sequence of frames or a method the peer can't take
CHANNEL_ERROR: Final = 504  # hard: a channel that is not open, or a wrong method on channel 0
UNEXPECTED_FRAME: Final = 505  # hard: a frame the recipient wasn't expecting
RESOURCE_ERROR: Final = 506  # hard
NOT_ALLOWED: Final = 530  # hard
NOT_IMPLEMENTED: Final = 540  # hard
INTERNAL_ERROR: Final = 541  # hard

SOFT_ERRORS: Final = frozenset(
    {CONTENT_TOO_LARGE, NO_ROUTE, NO_CONSUMERS, ACCESS_REFUSED, NOT_FOUND, RESOURCE_LOCKED,
     PRECONDITION_FAILED}
)  # fmt: skip

REPLY_TEXTS: Final = {
    REPLY_SUCCESS: "REPLY_SUCCESS",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}

# Field tables nest ('F' in 'F', 'A' in 'A'); a hostile peer could nest deep enough to exhaust
# Python's recursion limit (1000), so deeper than this is a 502 syntax error. RabbitMQ has no
# limit, but real headers (x-death: an array of tables) nest 3 deep.
MAX_TABLE_DEPTH: Final = 64
# A shortstr is at most 255 octets (spec 4.2.5.3); field names at most 128 (spec 4.2.5.5 guideline,
# pamqp truncates beyond it). BraidMQ enforces only the 255 wire limit.
SHORTSTR_MAX: Final = 255
