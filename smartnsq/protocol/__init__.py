"""Sans-IO NSQ protocol: bytes in, frames and messages out; commands to bytes.

Nothing here touches a socket, an event loop or a clock.
"""

from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    CLOSE_WAIT,
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    OK,
    Frame,
    FrameDecoder,
    encode_frame,
)
from smartnsq.protocol.message import (
    CLASSIC,
    MessageLayout,
    PublishResult,
    RawMessage,
    decode_message,
    decode_publish_response,
    encode_message,
    partition_of,
)
from smartnsq.protocol.names import validate_channel, validate_topic

__all__ = [
    "CLASSIC",
    "CLOSE_WAIT",
    "DEFAULT_MAX_FRAME_SIZE",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "FRAME_RESPONSE",
    "HEARTBEAT",
    "OK",
    "Frame",
    "FrameDecoder",
    "MessageLayout",
    "PublishResult",
    "RawMessage",
    "commands",
    "decode_message",
    "decode_publish_response",
    "encode_frame",
    "encode_message",
    "partition_of",
    "validate_channel",
    "validate_topic",
]
