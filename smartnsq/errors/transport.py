"""Errors of the way to nsqd and lookupd: a closed or failed connection, bytes that are not
NSQ, a deadline passed, nobody to ask. Import them from ``smartnsq.errors``."""

from __future__ import annotations

from typing import Any

from smartnsq.errors.common import NSQError

__all__ = [
    "ConnectFailed",
    "ConnectionClosed",
    "InsecureAuth",
    "LookupFailed",
    "NSQTimeout",
    "NoNsqdAvailable",
    "NsqdHttpFailed",
    "PartialPublish",
    "ProtocolError",
    "TopicNotFound",
    "closed_error",
]


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

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.published), self.__dict__


class NsqdHttpFailed(NSQError):
    """An nsqd HTTP endpoint (``/stats``, ``/channel/setoffset``) could not be reached or
    answered with an error."""


class LookupFailed(NSQError):
    """No lookupd could be asked, or none gave a usable answer.

    A consumer logs it and keeps its connections; a publish that needs a lookup can raise it.
    """


class TopicNotFound(NSQError):
    """No lookupd knows the topic (a lookup answered 404). On the Youzan fork, where an
    operator creates topics, a publish through lookupd raises it until the topic exists (on a
    classic cluster it goes to one of the nsqd lookupd knows, which creates the topic)."""
