"""Errors of the way to nsqd and lookupd: a closed or failed connection, bytes that are not
NSQ, a deadline passed, nobody to ask. Import them from ``smartnsq.errors``."""

from __future__ import annotations

from typing import Any

from smartnsq.errors.common import NSQError

__all__ = [
    "ConfigRefused",
    "ConnectFailed",
    "ConnectionClosed",
    "InsecureAuth",
    "LookupFailed",
    "NSQTimeout",
    "NoNsqdAvailable",
    "NsqdHttpFailed",
    "OutcomeUnknown",
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


class OutcomeUnknown(ConnectionClosed):
    """The connection ended after a request was sent and before nsqd answered it.

    nsqd may or may not have carried it out: a publish that raises it may or may not have
    been published (nsqd may have stored it before the connection ended, or store it later:
    a stopped nsqd reads what was sent when it resumes). A producer never sends it again;
    publishing it again yourself may store it twice.
    """


def unanswered_error(address: str, reason: BaseException | None) -> OutcomeUnknown:
    """The error of a request sent to ``address`` whose connection ended before the answer.

    Args:
        address: The nsqd address.
        reason: Why the connection ended, or None.

    Returns:
        An [`OutcomeUnknown`][smartnsq.errors.OutcomeUnknown] saying so.
    """
    text = f"connection to nsqd {address} ended before it answered"
    if reason is not None and str(reason):
        text += f" ({reason})"
    err = OutcomeUnknown(
        f"{text}: the request may or may not have been carried out (a publish may or may not "
        "have been published); it is not sent again"
    )
    err.__cause__ = reason
    return err


class ConnectFailed(ConnectionClosed):
    """Could not open or handshake a connection to an nsqd (refused, unreachable, timed out)."""


class ConfigRefused(ConnectFailed):
    """nsqd will not accept this client's settings, so reconnecting cannot help.

    It refused IDENTIFY (a value outside its limits, say ``output_buffer_timeout`` under its
    ``--min-output-buffer-timeout``: ``E_BAD_BODY``) or AUTH (``E_AUTH_FAILED``,
    ``E_UNAUTHORIZED``), or it requires TLS or AUTH that is not configured (or TLS was
    required and it offers none). Raised when a Consumer or Producer starts (and by a
    publish that needs a new connection); the message says what to change, ``__cause__``
    holds nsqd's own error. A connection failure, so ``except ConnectFailed`` catches it.

    Args:
        message: The error text.
        address: The nsqd that refused.

    Attributes:
        address: The nsqd that refused.
    """

    def __init__(self, message: str, address: str = "") -> None:
        super().__init__(message)
        self.address = address

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.address), self.__dict__


class InsecureAuth(ConfigRefused):
    """nsqd asked for AUTH on an unencrypted connection and ``auth_over_plaintext`` is False.

    The secret was not sent.
    """


class NSQTimeout(NSQError, TimeoutError):
    """An operation did not finish within its deadline. Its outcome is unknown.

    A publish that raises it may or may not have been published: nsqd may have stored it
    without its answer arriving in time, or store it later (a stopped nsqd reads what was
    sent when it resumes). A producer never sends it again; publishing it again yourself may
    store it twice.
    """


class NoNsqdAvailable(NSQError):
    """No nsqd could take the request (all down, or none configured or discovered).

    A publish whose ``timeout`` ran out before it was sent (connecting, a lookup, waiting to
    retry) raises it too, saying "publish not sent": nsqd cannot hold that message.
    """


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
