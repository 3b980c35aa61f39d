"""The ordered hot path (Intake.on_ordered) against the general one: the same message
fields, order checks, blocked warnings and errors, for frames no real nsqd would send."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from smartnsq import Consumer, Message
from smartnsq.consumer import Subscription
from smartnsq.consumer.message import sub_of
from smartnsq.errors import ProtocolError
from smartnsq.protocol.frames import FRAME_MESSAGE, FrameDecoder, encode_frame
from smartnsq.protocol.message import MessageLayout, RawMessage, decode_message, encode_message

LAYOUT = MessageLayout(binary_id=True, offset=True)


def frame(internal_id: int, offset: int, attempts: int = 1, body: bytes = b"x") -> bytes:
    mid = internal_id.to_bytes(8, "big") + (internal_id + 7).to_bytes(8, "big")
    raw = RawMessage(
        1_700_000_000_000_000_000 + internal_id, attempts, mid, body, 0, None, offset, 80
    )
    return encode_frame(FRAME_MESSAGE, encode_message(raw, LAYOUT))


class Setup:
    def __init__(self, straight: bool = True, sync: bool = False, **options: Any) -> None:
        self.violations: list[tuple[int | None, int, int]] = []
        self.blocked: list[int] = []

        async def handle(message: Message) -> None:
            pass

        def handle_in_a_thread(message: Message) -> None:
            pass

        self.consumer = Consumer(
            "t",
            "c",
            handle_in_a_thread if sync else handle,
            nsqd_tcp_addresses=["127.0.0.1:4150"],
            on_order_violation=lambda m, i, o: self.violations.append((m.offset, i, o)),
            on_blocked=lambda m: self.blocked.append(m.attempts),
            **options,
        )
        features = SimpleNamespace(youzan=True, max_rdy_count=2500)
        self.writes: list[bytes] = []
        conn = SimpleNamespace(
            features=features,
            raw_write=self.writes.append,
            raw_write_now=self.writes.append,
            queue=lambda data: None,
        )
        self.reader = Subscription(self.consumer._answers, "127.0.0.1:4150", conn, 3, ordered=True)  # type: ignore[arg-type]
        assert self.reader.straight
        self.reader.straight = straight  # False: the general path, for comparison
        self.consumer._intake.attach(self.reader, conn)  # type: ignore[arg-type]
        self.on_messages = conn.on_messages
        self.decoder = FrameDecoder()

    def feed(self, *frames: bytes) -> list[Message]:
        src, spans = self.decoder.feed_spans(b"".join(frames))
        self.on_messages(src, spans)
        queued = list(self.consumer._workers.queue)  # no worker waits: the messages are queued
        self.consumer._workers.queue.clear()
        return queued


def test_only_plain_ordered_readers_take_the_hot_path() -> None:
    s = Setup()
    assert s.on_messages.func == s.consumer._intake.on_ordered
    # Touching needs only the arrival time, which the hot path stamps too.
    touching = Setup(auto_touch=True)
    assert touching.on_messages.func == touching.consumer._intake.on_ordered
    # A plain function handler runs in the worker threads, which take the general path.
    threaded = Setup(sync=True)
    assert threaded.on_messages.func == threaded.consumer._intake.on_messages
    # An ext topic's messages carry headers: the general path decodes them.
    assert not Subscription(
        s.consumer._answers, "a:1", s.reader.conn, 3, ordered=True, ext=True
    ).straight


def test_messages_decode_as_the_general_path_does() -> None:
    s = Setup()
    assert s.reader.straight
    data = frame(5, 100, attempts=2, body=b"hello")
    (got,) = s.feed(data)
    want = decode_message(data[8:], LAYOUT, Message)
    for name in ("timestamp", "attempts", "id", "body", "offset", "raw_size", "ext", "ext_version"):
        assert getattr(got, name) == getattr(want, name), name
    assert (got.internal_id, got.trace_id, got.partition) == (5, 12, 3)
    assert sub_of(got) is s.reader and not got.has_responded
    assert s.reader.in_flight == 1


STRAIGHT = pytest.mark.parametrize("straight", [True, False], ids=["hot", "general"])


@STRAIGHT
def test_backwards_offsets_or_ids_are_reported_and_do_not_move_the_watermark(
    straight: bool,
) -> None:
    s = Setup(straight)
    s.feed(frame(5, 100), frame(6, 200))
    s.feed(frame(7, 150))  # offset went back
    s.feed(frame(4, 300))  # internal id went back
    s.feed(frame(6, 200))  # a redelivery of the last good one: allowed
    s.feed(frame(8, 400))
    assert s.violations == [(150, 6, 200), (300, 6, 200)]
    checker = s.consumer._intake.order[3]
    assert (checker.last_id, checker.last_offset) == (8, 400)


@STRAIGHT
def test_a_message_stuck_on_many_attempts_is_reported(
    straight: bool, caplog: pytest.LogCaptureFixture
) -> None:
    s = Setup(straight, blocked_warn_attempts=3, blocked_error_attempts=5)
    caplog.set_level(logging.WARNING, logger="smartnsq.consumer")
    for attempts in range(1, 7):
        for msg in s.feed(frame(5, 100, attempts=attempts)):
            s.consumer._answers.req(msg, None, False)  # failed: nsqd sends it again
    assert s.blocked == [3, 4, 5, 6]
    assert not s.violations
    levels = [r.levelno for r in caplog.records if "is blocked" in r.getMessage()]
    assert levels == [logging.WARNING, logging.ERROR, logging.ERROR]  # at 3, 5, and 6 (2 x 3)


@STRAIGHT
def test_a_frame_too_short_for_its_offset_block_is_a_protocol_error(straight: bool) -> None:
    s = Setup(straight)
    short = encode_frame(FRAME_MESSAGE, encode_message(RawMessage(1, 1, b"i" * 16, b""))[:30])
    with pytest.raises(ProtocolError, match="ends before its offset block"):
        s.feed(short)


@STRAIGHT
def test_a_copy_of_the_message_in_progress_is_not_handed_on(straight: bool) -> None:
    """nsqd sends an ordered message again when its timeout passes while the handler
    runs: the copy waits for the first one's answer, which answers it too (same id)."""
    s = Setup(straight)
    (first,) = s.feed(frame(5, 100))
    assert s.feed(frame(5, 100, attempts=2)) == []  # still being handled
    assert s.reader.in_flight == 1 and s.writes == []
    s.consumer._answers.fin(first)
    assert s.writes == [b"FIN " + first.id + b"\n"] and s.reader.in_flight == 0
    (after,) = s.feed(frame(6, 131))
    assert after.offset == 131


@STRAIGHT
def test_the_same_delivery_twice_is_finished_again_not_handled_again(straight: bool) -> None:
    s = Setup(straight)
    (first,) = s.feed(frame(5, 100))
    s.consumer._answers.fin(first)
    assert s.feed(frame(5, 100)) == []  # the same attempts: the delivery already answered
    assert s.writes == [b"FIN " + first.id + b"\n"] * 2 and s.reader.in_flight == 0
    assert s.consumer.stats().received == 1


@STRAIGHT
def test_a_redelivery_after_a_requeue_is_handled(straight: bool) -> None:
    s = Setup(straight)
    (first,) = s.feed(frame(5, 100))
    s.consumer._answers.req(first, None, False)
    (again,) = s.feed(frame(5, 100, attempts=2))
    assert again.id == first.id and again.attempts == 2 and s.reader.in_flight == 1
