"""nsqd's error frames as typed exceptions: :class:`ServerError`, a subclass per known code,
and :func:`error_from_frame`, which picks the class for a frame's payload. Import them from
``smartnsq.errors``."""

from __future__ import annotations

import enum
from typing import Any

from smartnsq.errors.common import NSQError

__all__ = [
    "AuthFailed",
    "BadBody",
    "BadChannel",
    "BadMessage",
    "BadPartition",
    "BadTag",
    "BadTopic",
    "ExtNotSupported",
    "FinFailed",
    "IdentifyFailed",
    "InvalidCommand",
    "NotLeader",
    "NotWritable",
    "PubFailed",
    "PubTooMuchWaiting",
    "ReqFailed",
    "Retry",
    "ServerError",
    "SubExtendForbidden",
    "SubExtendNeeded",
    "SubOrderRequired",
    "TagNotSupported",
    "TopicNotExist",
    "TouchFailed",
    "Unauthorized",
    "error_from_frame",
]


class Retry(enum.Enum):
    """Whether the command that caused a :class:`ServerError` may be sent again."""

    NEVER = "never"  # the request itself is wrong: sending it again fails again
    SAFE = "safe"  # transient: retry, possibly on another nsqd
    AFTER_REFRESH = "after_refresh"  # cluster layout changed: re-query lookupd, then retry


class ServerError(NSQError):
    """nsqd answered with an error frame.

    Subclasses name the codes smartnsq knows; other codes raise ``ServerError`` itself.

    Args:
        code: The ``E_...`` code (first word of the frame).
        description: The rest of the text.
        fatal: Whether the server closes the connection after it; None: the class's
            default.

    Attributes:
        code: The ``E_...`` code.
        description: The rest of the text.
        fatal: Whether the server closes the connection after sending it.
        retry: Whether the command may be sent again ([`Retry`][smartnsq.errors.Retry]).
    """

    code: str = ""
    default_fatal: bool = True
    retry: Retry = Retry.NEVER
    hint = ""  # what to change, appended to the server's text

    def __init__(self, code: str, description: str = "", *, fatal: bool | None = None) -> None:
        self.code = code
        self.description = description
        self.fatal = self.default_fatal if fatal is None else fatal
        text = f"{code} {description}".strip()
        if self.hint:
            text = f"{text}: {self.hint}"
        super().__init__(text or "unknown server error")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from the code and description: the text already has the hint in it.
        return type(self), (self.code, self.description), self.__dict__


class InvalidCommand(ServerError):
    """nsqd did not understand a command (``E_INVALID``); raised for a request it refused."""

    code = "E_INVALID"


class BadBody(ServerError):
    """nsqd refused a message body (``E_BAD_BODY``: empty, or larger than its limits)."""

    code = "E_BAD_BODY"


class BadTopic(ServerError):
    """nsqd refused the topic name (``E_BAD_TOPIC``)."""

    code = "E_BAD_TOPIC"


class BadChannel(ServerError):
    """nsqd refused the channel name (``E_BAD_CHANNEL``)."""

    code = "E_BAD_CHANNEL"


class BadMessage(ServerError):
    """nsqd refused a message (``E_BAD_MESSAGE``)."""

    code = "E_BAD_MESSAGE"


class BadPartition(ServerError):
    """The Youzan fork refused the partition (``E_BAD_PARTITION``)."""

    code = "E_BAD_PARTITION"


class PubFailed(ServerError):
    """nsqd could not store a publish (``E_PUB_FAILED``); retried by the producer."""

    code = "E_PUB_FAILED"
    default_fatal = False
    retry = Retry.SAFE


class FinFailed(ServerError):
    """nsqd refused a FIN (``E_FIN_FAILED``: unknown or timed-out message id); logged by the
    consumer.
    """

    code = "E_FIN_FAILED"
    default_fatal = False


class ReqFailed(ServerError):
    """nsqd refused a REQ (``E_REQ_FAILED``); logged by the consumer."""

    code = "E_REQ_FAILED"
    default_fatal = False


class TouchFailed(ServerError):
    """nsqd refused a TOUCH (``E_TOUCH_FAILED``); logged by the consumer."""

    code = "E_TOUCH_FAILED"
    default_fatal = False


class IdentifyFailed(ServerError):
    """nsqd refused IDENTIFY (``E_IDENTIFY_FAILED``): raised when a connection opens."""

    code = "E_IDENTIFY_FAILED"


class AuthFailed(ServerError):
    """nsqd refused the AUTH secret (``E_AUTH_FAILED`` or another ``E_AUTH...``)."""

    code = "E_AUTH_FAILED"


class Unauthorized(ServerError):
    """The AUTH identity may not do this (``E_UNAUTHORIZED``): publish or subscribe refused."""

    code = "E_UNAUTHORIZED"


class TopicNotExist(ServerError):
    """This nsqd does not hold the topic partition (Youzan fork)."""

    code = "E_TOPIC_NOT_EXIST"
    retry = Retry.AFTER_REFRESH


class NotLeader(ServerError):
    """This nsqd is not the partition leader (Youzan fork). Fatal except on publish."""

    code = "E_FAILED_ON_NOT_LEADER"
    retry = Retry.AFTER_REFRESH


class NotWritable(ServerError):
    """The partition cannot be written right now (Youzan fork). Fatal except on publish."""

    code = "E_FAILED_ON_NOT_WRITABLE"
    retry = Retry.AFTER_REFRESH


class PubTooMuchWaiting(ServerError):
    """The Youzan partition has too many publishes waiting (``E_PUB_TOO_MUCH_WAITING``); retried
    after a new lookup.
    """

    code = "E_PUB_TOO_MUCH_WAITING"
    retry = Retry.AFTER_REFRESH


class SubOrderRequired(ServerError):
    """The topic is ordered: subscribe with SUB_ORDERED."""

    code = "E_SUB_ORDER_IS_MUST"


class SubExtendNeeded(ServerError):
    """The topic carries ext headers: IDENTIFY with extend_support."""

    code = "E_SUB_EXTEND_NEED"


class SubExtendForbidden(ServerError):
    """The topic has no ext headers: IDENTIFY without extend_support."""

    code = "E_SUB_EXTEND_FORBIDDON"  # sic, as the server spells it


class ExtNotSupported(ServerError):
    """The topic is not an ext topic (``E_EXT_NOT_SUPPORT``): no headers, tags or client-side
    compression there.
    """

    code = "E_EXT_NOT_SUPPORT"
    default_fatal = False
    hint = (
        "headers, tags and compression need an ext topic (created with extend=true); "
        "publish without them or use an ext topic"
    )


class TagNotSupported(ServerError):
    """The topic (or the server) has no tag dispatch: tags need a Youzan ext topic."""

    code = "E_TAG_NOT_SUPPORT"
    default_fatal = False
    hint = "tags need an ext topic on a Youzan nsqd (created with extend=true); drop the tag"


class BadTag(ServerError):
    """nsqd refused a tag (1-100 characters of letters, digits, '_' and '-')."""

    code = "E_BAD_TAG"
    default_fatal = False
    hint = "a tag is 1-100 characters of ASCII letters, digits, '_' and '-'"


# Codes whose class is ServerError itself but whose fatality/retry differ from the default.
_PLAIN: dict[str, tuple[bool, Retry]] = {
    "E_MPUB_FAILED": (False, Retry.SAFE),
    "E_DPUB_FAILED": (False, Retry.SAFE),
    "E_INVALID_JSON_HEADER": (False, Retry.NEVER),
    "INVALID_TRACE_ID": (False, Retry.NEVER),
    "E_CREATE_TOPIC_FAILED": (False, Retry.NEVER),
    "E_SUB_CHANNEL_NOT_REGISTERED": (True, Retry.NEVER),
    "E_AUTH_FIRST": (True, Retry.NEVER),
    "E_AUTH_DISABLED": (True, Retry.NEVER),
    "E_BAD_PROTOCOL": (True, Retry.NEVER),
    "E_BAD_EXT": (True, Retry.NEVER),
}

_CLASSES: dict[str, type[ServerError]] = {
    cls.code: cls
    for cls in (
        InvalidCommand,
        BadBody,
        BadTopic,
        BadChannel,
        BadMessage,
        BadPartition,
        PubFailed,
        FinFailed,
        ReqFailed,
        TouchFailed,
        IdentifyFailed,
        AuthFailed,
        Unauthorized,
        TopicNotExist,
        NotLeader,
        NotWritable,
        PubTooMuchWaiting,
        SubOrderRequired,
        SubExtendNeeded,
        SubExtendForbidden,
        ExtNotSupported,
        TagNotSupported,
        BadTag,
    )
}

# On publish the fork answers these two without closing the connection.
_NON_FATAL_ON_PUBLISH = {"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE"}


def error_from_frame(data: bytes, *, publish: bool = False) -> ServerError:
    """Turn the payload of an error frame into a typed :class:`ServerError`.

    The code is the first word; the fork often sends it with an empty description
    (``b"E_TOPIC_NOT_EXIST "``).

    Args:
        data: The error frame's payload.
        publish: Whether the failed command was a publish, which changes the fatality of
            the fork's leader errors.

    Returns:
        The matching [`ServerError`][smartnsq.errors.ServerError] subclass, or
            ``ServerError`` itself for an unknown code.
    """
    text = data.decode("utf-8", "replace")
    code, _, description = text.partition(" ")
    description = description.strip()
    cls = _CLASSES.get(code)
    if cls is not None:
        fatal = False if publish and code in _NON_FATAL_ON_PUBLISH else None
        return cls(code, description, fatal=fatal)
    if code in _PLAIN:
        fatal, retry = _PLAIN[code]
        err = ServerError(code, description, fatal=fatal)
        err.retry = retry
        return err
    if code.startswith("E_AUTH"):
        return AuthFailed(code, description)
    # Unknown text, e.g. "too much client connections": the server closes after it.
    if not code.startswith("E_") and code != "INVALID_TRACE_ID":
        err = ServerError("", text.strip(), fatal=True)
        err.retry = Retry.SAFE
        return err
    return ServerError(code, description, fatal=True)
