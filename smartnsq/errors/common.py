"""The base of every smartnsq exception, and the errors of using smartnsq: a wrong argument
(nothing was sent), a feature the server lacks, a client used from the wrong thread or
process. Import them from ``smartnsq.errors``."""

from __future__ import annotations

__all__ = [
    "CodecUnavailable",
    "DataLoss",
    "DecompressFailed",
    "InsecureAuthWarning",
    "InvalidArgument",
    "InvalidChannel",
    "InvalidTag",
    "InvalidTopic",
    "InvalidType",
    "MessageTooLarge",
    "NSQError",
    "NotSupported",
    "OffsetOutOfRange",
    "UsedAfterFork",
    "WrongEventLoop",
]


class NSQError(Exception):
    """Base class of every smartnsq exception; also raised for misuse of a client's lifecycle
    (say, a Consumer started twice, or a message answered twice)."""


# -- caller mistakes ---------------------------------------------------------------------------


class InvalidArgument(NSQError, ValueError):
    """A value passed to smartnsq is not acceptable. Nothing was sent."""


class InvalidType(NSQError, TypeError):
    """A value passed to smartnsq has the wrong type. Nothing was sent."""


class InvalidTopic(InvalidArgument):
    """The topic name breaks NSQ's naming rules."""


class InvalidChannel(InvalidArgument):
    """The channel name breaks NSQ's naming rules."""


class MessageTooLarge(InvalidArgument):
    """A message (or a batch) is larger than the server accepts."""


class OffsetOutOfRange(InvalidArgument):
    """A start queue offset is before the partition's earliest retained message or past its
    end. Nothing was moved."""


class InvalidTag(InvalidArgument):
    """A dispatch tag that the Youzan fork does not accept. Nothing was sent."""


class NotSupported(NSQError):
    """The server (or its kind) does not support the requested feature.

    For example ``delay`` on a Youzan nsqd or ``partition`` on a classic one; nothing was
    sent.
    """


class CodecUnavailable(NotSupported):
    """A compression codec's library is not installed; the message names the extra."""


class DecompressFailed(NSQError):
    """A message's body names an unknown compression codec or is not a valid block of its
    codec. The consumer treats it as a handler failure for that message."""


class DataLoss(NSQError):
    """Messages to be read (by offset) are no longer retained by the server."""


class WrongEventLoop(NSQError, RuntimeError):
    """A client was used from a thread other than the one whose event loop started it.

    Its connections belong to that loop. Nothing was sent.
    """


class UsedAfterFork(NSQError, RuntimeError):
    """A client started before ``fork()`` was used in the child process. Nothing was sent."""


class InsecureAuthWarning(UserWarning):
    """The AUTH secret is about to be sent without TLS (given once per process)."""
