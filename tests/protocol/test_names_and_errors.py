import pytest

from smartnsq import errors
from smartnsq.errors import Retry, error_from_frame
from smartnsq.protocol import validate_channel, validate_topic


@pytest.mark.parametrize("name", ["t", "a.b_c-d", "x" * 64, "tmp#ephemeral", "A1"])
def test_valid_topic_names(name):
    assert validate_topic(name) == name
    assert validate_channel(name) == name


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("", "1 to 64"),
        ("x" * 65, "1 to 64"),
        ("has space", "may contain only"),
        ("a#b", "may contain only"),
        ("#ephemeral", "may contain only"),
        ("ünï", "may contain only"),
        ("a\n", "may contain only"),
    ],
)
def test_invalid_names(name, match):
    with pytest.raises(errors.InvalidTopic, match=match):
        validate_topic(name)
    with pytest.raises(errors.InvalidChannel, match=match):
        validate_channel(name)


def test_wrong_type_names():
    with pytest.raises(errors.InvalidType, match="must be a str"):
        validate_topic(b"t")


def test_invalid_names_are_value_errors():
    with pytest.raises(ValueError):
        validate_topic("")


@pytest.mark.parametrize(
    ("frame", "cls", "fatal", "retry"),
    [
        (b"E_INVALID invalid command", errors.InvalidCommand, True, Retry.NEVER),
        (b"E_BAD_MESSAGE PUB message too big", errors.BadMessage, True, Retry.NEVER),
        (b"E_BAD_TOPIC PUB topic name", errors.BadTopic, True, Retry.NEVER),
        (b"E_PUB_FAILED failed", errors.PubFailed, False, Retry.SAFE),
        (b"E_FIN_FAILED FIN abc failed", errors.FinFailed, False, Retry.NEVER),
        (b"E_REQ_FAILED x", errors.ReqFailed, False, Retry.NEVER),
        (b"E_TOUCH_FAILED x", errors.TouchFailed, False, Retry.NEVER),
        (b"E_TOPIC_NOT_EXIST ", errors.TopicNotExist, True, Retry.AFTER_REFRESH),
        (b"E_FAILED_ON_NOT_LEADER ", errors.NotLeader, True, Retry.AFTER_REFRESH),
        (b"E_FAILED_ON_NOT_WRITABLE ", errors.NotWritable, True, Retry.AFTER_REFRESH),
        (b"E_SUB_ORDER_IS_MUST this topic", errors.SubOrderRequired, True, Retry.NEVER),
        (b"E_SUB_EXTEND_NEED x", errors.SubExtendNeeded, True, Retry.NEVER),
        (b"E_SUB_EXTEND_FORBIDDON x", errors.SubExtendForbidden, True, Retry.NEVER),
        (b"E_EXT_NOT_SUPPORT ext", errors.ExtNotSupported, False, Retry.NEVER),
        (b"E_TAG_NOT_SUPPORT tag", errors.TagNotSupported, False, Retry.NEVER),
        (b"E_BAD_TAG bad", errors.BadTag, False, Retry.NEVER),
        (b"E_PUB_TOO_MUCH_WAITING pub", errors.PubTooMuchWaiting, True, Retry.AFTER_REFRESH),
        (b"E_AUTH_FAILED auth failed", errors.AuthFailed, True, Retry.NEVER),
        (b"E_UNAUTHORIZED no", errors.Unauthorized, True, Retry.NEVER),
    ],
)
def test_error_classification(frame, cls, fatal, retry):
    err = error_from_frame(frame)
    assert type(err) is cls
    assert err.fatal is fatal
    assert err.retry is retry
    assert err.code == frame.split(b" ")[0].decode()


def test_trailing_space_code_has_empty_description():
    err = error_from_frame(b"E_TOPIC_NOT_EXIST ")
    assert err.description == ""
    assert str(err) == "E_TOPIC_NOT_EXIST"


def test_leader_errors_are_not_fatal_on_publish():
    assert error_from_frame(b"E_FAILED_ON_NOT_LEADER ", publish=True).fatal is False
    assert error_from_frame(b"E_FAILED_ON_NOT_WRITABLE ", publish=True).fatal is False
    assert error_from_frame(b"E_TOPIC_NOT_EXIST ", publish=True).fatal is True


def test_unknown_and_plain_codes():
    mpub = error_from_frame(b"E_MPUB_FAILED boom")
    assert (mpub.fatal, mpub.retry) == (False, Retry.SAFE)
    raw = error_from_frame(b"too much client connections")
    assert raw.fatal and raw.retry is Retry.SAFE and "too much" in str(raw)
    unknown = error_from_frame(b"E_SOMETHING_NEW what")
    assert unknown.fatal and unknown.retry is Retry.NEVER
