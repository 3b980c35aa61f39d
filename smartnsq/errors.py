"""Every exception smartnsq raises.

Three families:

* [`InvalidArgument`][smartnsq.errors.InvalidArgument] and its subclasses: the caller passed
  something wrong; nothing was sent. They also derive from ``ValueError`` (or
  ``TypeError``) so generic handlers keep working.
* [`ServerError`][smartnsq.errors.ServerError] and its subclasses: nsqd answered a command
  with an error frame. Each knows whether the server closes the connection after it
  (``fatal``) and whether a retry can succeed (``retry``).
* Transport problems: [`ConnectionClosed`][smartnsq.errors.ConnectionClosed],
  [`ConnectFailed`][smartnsq.errors.ConnectFailed],
  [`ProtocolError`][smartnsq.errors.ProtocolError] (the peer sent bytes that are not NSQ)
  and [`NSQTimeout`][smartnsq.errors.NSQTimeout].
"""

from __future__ import annotations

import enum

__all__ = [
    "AuthFailed",
    "BadBody",
    "BadChannel",
    "BadMessage",
    "BadPartition",
    "BadTag",
    "BadTopic",
    "CodecUnavailable",
    "ConnectFailed",
    "ConnectionClosed",
    "DataLoss",
    "DecompressFailed",
    "ExtNotSupported",
    "FinFailed",
    "IdentifyFailed",
    "InsecureAuth",
    "InsecureAuthWarning",
    "InvalidArgument",
    "InvalidChannel",
    "InvalidCommand",
    "InvalidTag",
    "InvalidTopic",
    "InvalidType",
    "LookupFailed",
    "MessageTooLarge",
    "NSQError",
    "NSQTimeout",
    "NoNsqdAvailable",
    "NotLeader",
    "NotSupported",
    "NotWritable",
    "NsqdHttpFailed",
    "OffsetOutOfRange",
    "PartialPublish",
    "ProtocolError",
    "PubFailed",
    "PubTooMuchWaiting",
    "ReqFailed",
    "Retry",
    "ServerError",
    "SubExtendForbidden",
    "SubExtendNeeded",
    "SubOrderRequired",
    "TagNotSupported",
    "TopicNotFound",
    "TopicNotExist",
    "TouchFailed",
    "Unauthorized",
    "UsedAfterFork",
    "WrongEventLoop",
    "closed_error",
    "error_from_frame",
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


# -- transport ---------------------------------------------------------------------------------


class ProtocolError(NSQError):
    """The peer sent bytes that do not follow the NSQ protocol (it is not nsqd, or broken)."""


class ConnectionClosed(NSQError, ConnectionError):
    """The connection is closed (by us, by the server, or by the network).

    Raised by a request on a connection that is or went down; a producer retries it (up to
    ``max_retries``) before raising it.
    """


def closed_error(address: str, reason: BaseException | None) -> ConnectionClosed:
    """The error for using a connection to ``address`` that is closed, saying why.

    Args:
        address: The nsqd address.
        reason: Why the connection closed, or None.

    Returns:
        A [`ConnectionClosed`][smartnsq.errors.ConnectionClosed] naming the address and the
            reason.
    """
    text = f"connection to nsqd {address} is closed"
    if reason is not None and str(reason) and str(reason) not in text:
        text += f": {reason}"
    return ConnectionClosed(text)


class ConnectFailed(ConnectionClosed):
    """Could not open or handshake a connection to an nsqd (refused, unreachable, timed out)."""


class InsecureAuth(ConnectFailed):
    """nsqd asked for AUTH on an unencrypted connection and ``auth_over_plaintext`` is False.

    The secret was not sent.
    """


class NSQTimeout(NSQError, TimeoutError):
    """An operation did not finish within its deadline. Its outcome is unknown.

    A publish that raises it may or may not have been published.
    """


class NoNsqdAvailable(NSQError):
    """No nsqd could take the request (all down, or none configured or discovered)."""


class PartialPublish(NSQError):
    """``publish_many`` sent its batch in several MPUBs and one of them failed.

    ``published`` counts the leading messages that the server acknowledged; the rest were not
    acknowledged (``__cause__`` says why) and may be sent again.

    Args:
        message: The error text.
        published: How many leading messages were acknowledged.

    Attributes:
        published: How many leading messages were acknowledged.
    """

    def __init__(self, message: str, published: int) -> None:
        super().__init__(message)
        self.published = published


class NsqdHttpFailed(NSQError):
    """An nsqd HTTP endpoint (``/stats``, ``/channel/setoffset``) could not be reached or
    answered with an error."""


class LookupFailed(NSQError):
    """No lookupd could be asked, or none gave a usable answer.

    A consumer logs it and keeps its connections; a publish that needs a lookup can raise it.
    """


class TopicNotFound(NSQError):
    """No lookupd knows the topic (a lookup answered 404): a publish through lookupd raises it
    until the topic exists."""


# -- server error frames ------------------------------------------------------------------------


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
