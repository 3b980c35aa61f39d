"""``smartnsq.errors`` as one public module, whatever files hold its parts."""

from __future__ import annotations

import inspect
import pickle

import pytest

import smartnsq.errors as errors

# Every public name the module had as a single file: each must stay importable from it.
NAMES = [
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

EXCEPTIONS = [
    obj
    for name in NAMES
    if inspect.isclass(obj := getattr(errors, name)) and issubclass(obj, BaseException)
]


def test_every_name_is_public_and_lives_in_smartnsq_errors() -> None:
    assert sorted(errors.__all__) == sorted(NAMES)
    for name in NAMES:
        assert getattr(errors, name).__module__ == "smartnsq.errors", name


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_exceptions_pickle_by_their_public_name(cls: type[BaseException]) -> None:
    if cls is errors.PartialPublish:
        err: BaseException = errors.PartialPublish("2 of 3", 2)
    elif issubclass(cls, errors.ServerError):
        err = cls("E_X", "why", fatal=False)
    else:
        err = cls("why")
    data = pickle.dumps(err)
    assert b"smartnsq.errors\x94" in data  # found again by the public module's name
    back = pickle.loads(data)
    assert type(back) is cls and str(back) == str(err)  # a hint is not appended twice
    if isinstance(err, errors.PartialPublish):
        assert back.published == 2
    if isinstance(err, errors.ServerError):
        assert (back.code, back.description, back.fatal) == ("E_X", "why", False)


def test_the_families_and_the_builtin_bases_hold() -> None:
    assert issubclass(errors.InvalidTopic, errors.InvalidArgument)
    assert issubclass(errors.InvalidArgument, ValueError)
    assert issubclass(errors.InvalidType, TypeError)
    assert issubclass(errors.InsecureAuth, errors.ConnectFailed)
    assert issubclass(errors.ConnectFailed, errors.ConnectionClosed)
    assert issubclass(errors.ConnectionClosed, ConnectionError)
    assert issubclass(errors.NSQTimeout, TimeoutError)
    assert issubclass(errors.WrongEventLoop, RuntimeError)
    assert issubclass(errors.CodecUnavailable, errors.NotSupported)
    assert not issubclass(errors.InsecureAuthWarning, errors.NSQError)
    for cls in EXCEPTIONS:
        if cls is not errors.InsecureAuthWarning:
            assert issubclass(cls, errors.NSQError), cls
    frame = errors.error_from_frame(b"E_FAILED_ON_NOT_LEADER x", publish=True)
    assert isinstance(frame, errors.NotLeader) and not frame.fatal
    assert frame.retry is errors.Retry.AFTER_REFRESH
