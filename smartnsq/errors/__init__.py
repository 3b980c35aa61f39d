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

One module per family (``common``, ``transport``, ``server``); import from here, which is
where each exception's name and pickled form say it lives.
"""

from __future__ import annotations

from smartnsq.errors.common import (
    CodecUnavailable,
    DataLoss,
    DecompressFailed,
    InsecureAuthWarning,
    InvalidArgument,
    InvalidChannel,
    InvalidTag,
    InvalidTopic,
    InvalidType,
    MessageTooLarge,
    NotSupported,
    NSQError,
    OffsetOutOfRange,
    UsedAfterFork,
    WrongEventLoop,
)
from smartnsq.errors.server import (
    AuthFailed,
    BadBody,
    BadChannel,
    BadMessage,
    BadPartition,
    BadTag,
    BadTopic,
    ExtNotSupported,
    FinFailed,
    IdentifyFailed,
    InvalidCommand,
    NotLeader,
    NotWritable,
    PubFailed,
    PubTooMuchWaiting,
    ReqFailed,
    Retry,
    ServerError,
    SubExtendForbidden,
    SubExtendNeeded,
    SubOrderRequired,
    TagNotSupported,
    TopicNotExist,
    TouchFailed,
    Unauthorized,
    error_from_frame,
)
from smartnsq.errors.transport import (
    ConfigRefused,
    ConnectFailed,
    ConnectionClosed,
    InsecureAuth,
    LookupFailed,
    NoNsqdAvailable,
    NsqdHttpFailed,
    NSQTimeout,
    OutcomeUnknown,
    PartialPublish,
    ProtocolError,
    TopicNotFound,
    closed_error,
    unanswered_error,
)

__all__ = [
    "AuthFailed",
    "BadBody",
    "BadChannel",
    "BadMessage",
    "BadPartition",
    "BadTag",
    "BadTopic",
    "CodecUnavailable",
    "ConfigRefused",
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
    "OutcomeUnknown",
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
    "unanswered_error",
]

# Every exception keeps the name it always had, smartnsq.errors.X: in tracebacks, in
# pickles (which find it by that name) and in the API reference.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
