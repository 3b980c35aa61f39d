"""The front doors, without a server: what they expose of their settings."""

from __future__ import annotations

import pytest

from smartnsq import Producer
from smartnsq import sync as blocking


@pytest.mark.parametrize("make", [Producer, blocking.Producer])
def test_a_producers_settings_read_back_and_cannot_be_changed(make: type) -> None:
    producer = make(["127.0.0.1:4150"], timeout=3.0, max_retries=1, max_delay=60.0)
    assert (producer.timeout, producer.max_retries, producer.max_delay) == (3.0, 1, 60.0)
    assert producer.max_message_size == 1024 * 1024 and producer.compress_codec == "snappy"
    with pytest.raises(AttributeError):  # changing it would not change what it does
        producer.timeout = 1.0
