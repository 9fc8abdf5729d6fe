"""AMQP 0-9-1 errors: who is at fault and what goes back on the wire.

An error carries the reply code, text and the class/method ids of the failing method, exactly the
arguments of the Connection.Close or Channel.Close the server sends (spec 1.4.2.8, 1.5.2.5).
``AmqpConnectionError`` is a hard error: the server sends Connection.Close on channel 0 and then
waits only for Connection.Close-Ok. ``AmqpChannelError`` is a soft error: the server sends
Channel.Close on the channel and the connection lives on.

The decoder hands errors back as events (in the list ``AmqpDecoder.feed`` returns) rather than
raising them, so the frames parsed before a bad one are not lost; session code may raise them.
"""

from __future__ import annotations

from pamqp import commands

from gateway.amqp.constants import REPLY_TEXTS


class AmqpError(Exception):
    """Base of the AMQP 0-9-1 protocol errors; never raised itself."""

    def __init__(
        self,
        reply_code: int,
        reply_text: str = "",
        class_id: int = 0,
        method_id: int = 0,
        *,
        channel: int = 0,
    ) -> None:
        if not reply_text:
            reply_text = REPLY_TEXTS.get(reply_code, "")
        super().__init__(reply_code, reply_text, class_id, method_id)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id
        self.channel = channel

    def __str__(self) -> str:
        return (
            f"{self.reply_code} {self.reply_text} "
            f"(channel {self.channel}, method {self.class_id}.{self.method_id})"
        )

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, AmqpError)
        return self.args == other.args and self.channel == other.channel

    def __hash__(self) -> int:
        return hash((type(self), self.args, self.channel))

    def _text(self) -> str:
        # Close.reply_text is a shortstr: at most 255 octets once encoded.
        text = self.reply_text
        if len(text.encode("utf-8")) > 255:
            text = text.encode("utf-8")[:255].decode("utf-8", "ignore")
        return text


class AmqpConnectionError(AmqpError):
    """A hard error (reply codes 320, 402, 5xx): close the whole connection."""

    def close_method(self) -> commands.Connection.Close:
        """The Connection.Close to send on channel 0."""
        return commands.Connection.Close(
            self.reply_code, self._text(), self.class_id, self.method_id
        )


class AmqpChannelError(AmqpError):
    """A soft error (reply codes 311-313, 403-406): close only ``channel``."""

    def close_method(self) -> commands.Channel.Close:
        """The Channel.Close to send on ``self.channel``."""
        return commands.Channel.Close(self.reply_code, self._text(), self.class_id, self.method_id)
