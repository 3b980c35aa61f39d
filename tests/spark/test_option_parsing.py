"""Option parsing of the nsq data source (no Spark needed: options arrive as a string map)."""

from __future__ import annotations

import pytest

from smartnsq import Consumer, Producer
from smartnsq.errors import InvalidArgument
from smartnsq.spark.options import parse


def test_nsq_options_become_typed_keyword_arguments() -> None:
    settings = parse(
        {
            "nsqd": "127.0.0.1:4150, 127.0.0.2:4150",
            "topic": "t",
            "nsq.max_retries": "5",
            "nsq.tls": "true",
            "nsq.auth_secret": "s3cret",
            "nsq.sharding": "java",
            "nsq.timeout": "2.5",
        },
        reading=False,
        client=Producer,
    )
    assert settings.nsqd == ("127.0.0.1:4150", "127.0.0.2:4150")
    assert dict(settings.client) == {
        "max_retries": 5,
        "tls": True,
        "auth_secret": "s3cret",
        "sharding": "java",
        "timeout": 2.5,
    }


def test_option_names_match_whatever_their_case() -> None:
    # Spark lower-cases the keys; a map built by hand may not.
    settings = parse(
        {
            "LOOKUPD": "127.0.0.1:4161",
            "topic": "t",
            "Channel": "c",
            "maxmessagespertrigger": "7",
            "NSQ.Max_In_Flight": "9",
            "nsq.msg_timeout": "30",
        },
        reading=True,
        client=Consumer,
    )
    assert settings.lookupd and settings.channel == "c" and settings.max_per_trigger == 7
    assert dict(settings.client) == {"max_in_flight": 9, "msg_timeout": 30.0}


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"topci": "t"}, "unknown option 'topci'"),
        ({"topic": "t", "nsq.sharding": "python"}, "must be one of go, java, not 'python'"),
        ({"topic": "t", "nsq.on_blocked": "x"}, "unknown option 'nsq.on_blocked'"),
        ({"topic": "t", "nsq.timeout": "soon"}, "option 'nsq.timeout' must be a number"),
        ({"topic": "t", "nsq.timeout": "0"}, "timeout must be > 0"),
        ({"topic": "t", "batchSize": "-1"}, "option 'batchSize' must be >= 1"),
        ({"topic": "t", "ignoreExtraColumns": "perhaps"}, "must be true or false"),
    ],
)
def test_bad_write_options_are_named(options: dict[str, str], text: str) -> None:
    with pytest.raises(InvalidArgument, match=text):
        parse({"nsqd": "127.0.0.1:4150", **options}, reading=False, client=Producer)


def test_the_path_names_the_topic() -> None:
    options = {"nsqd": "127.0.0.1:4150", "path": "events"}
    assert parse(options, reading=False, client=Producer).topic == "events"
    with pytest.raises(InvalidArgument, match="give one"):
        parse({**options, "topic": "other"}, reading=False, client=Producer)


def test_reader_options_for_dead_letters_and_output_buffering() -> None:
    settings = parse(
        {
            "nsqd": "127.0.0.1:4150",
            "topic": "t",
            "channel": "c",
            "nsq.dead_letter_topic": "t.dead",
            "nsq.output_buffer_timeout": "0.025",
            "nsq.output_buffer_size": "1024",
        },
        reading=True,
        client=Consumer,
    )
    assert dict(settings.client) == {
        "dead_letter_topic": "t.dead",
        "output_buffer_timeout": 0.025,
        "output_buffer_size": 1024,
    }
