"""The consumer's parts against fake connections (no sockets): what each writes for the
reads it is given, as h11 is tested against its state machine."""

from __future__ import annotations

import threading
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from smartnsq.consumer.answers import Answers
from smartnsq.consumer.intake import Intake
from smartnsq.consumer.message import Message, owed
from smartnsq.consumer.options import Options
from smartnsq.consumer.pacing import Pacing
from smartnsq.consumer.sinks import Sinks
from smartnsq.consumer.state import State
from smartnsq.consumer.subscription import Subscription
from smartnsq.consumer.threads import Threads
from smartnsq.consumer.workers import Workers
from smartnsq.errors import ConnectionClosed, NSQError
from smartnsq.net.inbox import Kind
from smartnsq.protocol.frames import FRAME_MESSAGE, FrameDecoder, encode_frame
from smartnsq.protocol.message import CLASSIC, RawMessage, encode_message


class FakeConn:
    """What a subscription uses of a Connection: writes and queued commands are recorded."""

    def __init__(self, youzan: bool = False) -> None:
        self.features = SimpleNamespace(
            youzan=youzan, max_rdy_count=2500, msg_timeout=60.0, max_msg_timeout=900.0
        )
        self.written: list[bytes] = []
        self.queued: list[bytes] = []
        self.usable = True
        self.closed = False
        self.on_messages: Any = None
        self.before_read: Any = None
        self.local_address = "127.0.0.1:1"

    def raw_write(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionClosed("gone")
        self.written.append(data)

    raw_write_now = raw_write

    def queue(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionClosed("gone")
        self.queued.append(data)


class Parts:
    def __init__(self, handler: Any = None, **options: Any) -> None:
        options.setdefault("nsqd_tcp_addresses", ["127.0.0.1:4150"])
        self.state = State(Options("t", "c", handler, **options))
        self.pacing = Pacing(self.state)
        self.answers = Answers(self.state, self.pacing)
        self.threads = Threads(self.state, self.answers)
        self.workers = Workers(self.state, self.answers)
        self.intake = Intake(self.state, self.answers, self.workers, self.threads)
        self.sinks = Sinks(self.intake, self.answers, self.state.options)
        self.state.thread = threading.get_ident()

    def subscribe(self, address: str = "n1:4150", **kwargs: Any) -> tuple[Subscription, FakeConn]:
        conn = FakeConn()
        sub = Subscription(self.answers, address, conn, **kwargs)  # type: ignore[arg-type]
        self.intake.attach(sub, conn)  # type: ignore[arg-type]
        self.state.subs[(address, None)] = sub
        return sub, conn


def read(*messages: tuple[bytes, int, bytes]) -> tuple[bytes, list[Any]]:
    """One read holding classic message frames (id, attempts, body)."""
    data = b"".join(
        encode_frame(FRAME_MESSAGE, encode_message(RawMessage(1, attempts, mid, body), CLASSIC))
        for mid, attempts, body in messages
    )
    return FrameDecoder().feed_spans(data)


MID = b"0123456789abcdef"
MID2 = b"fedcba9876543210"


def test_classic_reads_are_queued_as_messages_and_counted() -> None:
    p = Parts()
    sub, conn = p.subscribe()
    sub.set_rdy(10)
    conn.on_messages(*read((MID, 1, b"a"), (MID2, 2, b"b")))
    queued = list(p.workers.queue)
    assert [(m.id, m.attempts, m.body) for m in queued] == [(MID, 1, b"a"), (MID2, 2, b"b")]
    assert queued[0].nsqd_address == "n1:4150" and queued[0].partition is None
    assert (sub.in_flight, sub.rdy_left, sub.received, p.state.received) == (2, 8, 2, 2)


def test_fin_req_touch_of_one_message_and_a_second_answer_raises() -> None:
    p = Parts(requeue_delay=10, max_requeue_delay=15)
    sub, conn = p.subscribe()
    conn.on_messages(*read((MID, 1, b"a"), (MID2, 2, b"b")))
    first, second = p.workers.queue
    first.touch()
    first.finish()
    second.requeue()  # the policy: 10 s x 2 attempts, capped at 15 s
    assert conn.queued == [b"TOUCH " + MID + b"\n", b"RDY 0\n"]  # the REQ: backoff
    assert conn.written == [b"FIN " + MID + b"\n", b"REQ " + MID2 + b" 15000\n"]
    assert (p.answers.finished, p.answers.requeued, sub.in_flight) == (1, 1, 0)
    with pytest.raises(NSQError, match="already answered"):
        first.finish()
    with pytest.raises(NSQError, match="already answered"):
        second.touch()


def test_an_ordered_requeue_has_no_delay_and_a_lost_connection_is_not_counted() -> None:
    p = Parts()
    sub, conn = p.subscribe(ordered=False)
    sub.ordered = True
    conn.on_messages(*read((MID, 3, b"a"), (MID2, 1, b"b")))
    first, second = p.workers.queue
    first.requeue(30)
    assert conn.written == [b"REQ " + MID + b" 0\n"]
    conn.closed = True
    second.finish()  # nsqd redelivers it: logged, not raised, not counted
    assert (p.answers.finished, p.answers.requeued, sub.in_flight) == (0, 1, 0)


def test_past_max_attempts_gives_up_calls_back_and_fins_uncounted() -> None:
    given_up: list[Message] = []
    p = Parts(max_attempts=2, on_giving_up=given_up.append)
    _, conn = p.subscribe()
    conn.on_messages(*read((MID, 3, b"a"), (MID2, 2, b"b")))
    assert [m.id for m in given_up] == [MID] and [m.id for m in p.workers.queue] == [MID2]
    assert conn.written == [b"FIN " + MID + b"\n"]
    assert (p.answers.discarded, p.answers.finished) == (1, 0)


def test_a_failure_backs_off_every_subscription_and_a_success_resumes() -> None:
    p = Parts(max_in_flight=10, backoff_unit=0.01)
    (s1, c1), (s2, _) = p.subscribe("n1:4150"), p.subscribe("n2:4150")
    p.pacing.redistribute()
    assert (s1.rdy, s2.rdy) == (5, 5)
    c1.on_messages(*read((MID, 1, b"a")))
    (msg,) = p.workers.queue
    p.answers.handler_failed(msg, ValueError("boom"))
    assert p.pacing.backoff.level == 1 and (s1.rdy, s2.rdy) == (0, 0)
    assert c1.written == [b"REQ " + MID + b" 90000\n"]
    assert p.pacing.backoff.window_over(p.pacing.backoff.epoch)  # the window has run out
    p.answers.finish_ids(s2, [MID2])  # a success lowers the level again
    assert p.pacing.backoff.level == 0 and s1.rdy + s2.rdy == 10


def test_a_raw_sink_takes_whole_reads_and_answers_by_id() -> None:
    p = Parts()
    sub, conn = p.subscribe()
    reads: list[tuple[Subscription, bytes, list[Any]]] = []
    p.sinks.set_raw(lambda s, src, spans: reads.append((s, src, spans)))
    conn.on_messages(*read((MID, 1, b"a"), (MID2, 1, b"b")))
    assert not p.workers.queue and len(reads) == 1 and len(reads[0][2]) == 2
    ids = [reads[0][1][start + 10 : start + 26] for _, start, _ in reads[0][2]]
    sub.answers.touch_ids(sub, ids)
    sub.answers.finish_ids(sub, ids[:1])
    sub.answers.requeue_ids(sub, ids[1:])
    assert conn.written == [
        b"TOUCH " + MID + b"\nTOUCH " + MID2 + b"\n",
        b"FIN " + MID + b"\n",
        b"REQ " + MID2 + b" 0\n",
    ]
    assert (p.answers.finished, p.answers.requeued, sub.in_flight) == (1, 1, 0)


def test_a_message_sink_takes_each_message_and_settles_it() -> None:
    p = Parts()
    sub, conn = p.subscribe()
    taken: list[Message] = []
    p.sinks.set(taken.append)
    conn.on_messages(*read((MID, 1, b"a"), (MID2, 1, b"b"), (b"x" * 16, 1, b"c")))
    assert [m.body for m in taken] == [b"a", b"b", b"c"] and not p.workers.queue
    p.sinks.settle(taken[0])
    p.sinks.settle(taken[1], "back")
    taken[2].disable_auto_response()
    p.sinks.settle(taken[2])  # auto response off: the owner answers it
    assert conn.written == [b"FIN " + MID + b"\n", b"REQ " + MID2 + b" 0\n"]
    assert sub.in_flight == 1
    with pytest.raises(NSQError, match="without a handler"):
        Parts(lambda m: None).sinks.set(taken.append)


def test_a_read_sink_takes_classic_reads_whole_and_its_owner_makes_the_messages() -> None:
    given_up: list[Message] = []
    p = Parts(max_attempts=2, on_giving_up=given_up.append)
    sub, conn = p.subscribe()
    taken: list[Message] = []
    reads: list[tuple[Subscription, bytes, list[Any]]] = []
    p.sinks.set(taken.append, lambda s, src, spans: reads.append((s, src, spans)))
    conn.on_messages(*read((MID, 1, b"a"), (MID2, 3, b"b"), (b"x" * 16, 2, b"c")))
    assert not taken and not p.workers.queue and len(reads) == 1
    assert (sub.in_flight, sub.received) == (3, 3)  # counted when the read came
    made = p.sinks.messages(*reads[0])
    first = next(made)
    assert (first.id, first.attempts, first.body, first.nsqd_address) == (MID, 1, b"a", "n1:4150")
    assert not given_up  # made one at a time, as taken
    rest = list(made)
    assert [m.body for m in rest] == [b"c"] and [m.id for m in given_up] == [MID2]
    p.sinks.settle_all([first, *rest])
    assert conn.written == [
        b"FIN " + MID2 + b"\n",
        b"FIN " + MID + b"\n",
        b"FIN " + b"x" * 16 + b"\n",
    ]
    assert (p.answers.finished, p.answers.discarded, sub.in_flight) == (2, 1, 0)
    p.state.stopping = True  # a read while stopping goes the usual way: given back
    conn.on_messages(*read((MID, 1, b"d")))
    assert len(reads) == 1 and conn.written[-1] == b"REQ " + MID + b" 0\n"


def test_while_stopping_a_read_is_given_back_at_once() -> None:
    p = Parts()
    _, conn = p.subscribe()
    p.state.stopping = True
    conn.on_messages(*read((MID, 1, b"a")))
    assert conn.written == [b"REQ " + MID + b" 0\n"] and not p.workers.queue


def test_answers_from_another_thread_are_carried_to_the_loop_in_order() -> None:
    p = Parts()
    _, conn = p.subscribe()
    conn.on_messages(*read((MID, 1, b"a"), (MID2, 1, b"b")))
    first, second = p.workers.queue
    carried: deque[Any] = deque()
    p.answers.inbox = SimpleNamespace(put=carried.append)  # type: ignore[assignment]

    def elsewhere() -> None:
        first.finish()
        second.touch()
        second.requeue(0, backoff=False)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert conn.written == [] and [item[0] for item in carried] == [Kind.CALL] * 3
    assert not owed(first) and not owed(second)  # answered by hand: no automatic FIN later
    p.threads._on_inbox(carried)  # what the loop does with them
    assert conn.written == [b"FIN " + MID + b"\n", b"REQ " + MID2 + b" 0\n"]
    assert conn.queued[-1] == b"TOUCH " + MID2 + b"\n"


def test_handler_threads_fins_go_out_one_command_per_run_of_ids() -> None:
    p = Parts(lambda m: None)
    sub, conn = p.subscribe()
    p.threads.pool = SimpleNamespace(fins=[deque([sub, MID, MID2])])  # type: ignore[assignment]
    sub.in_flight = 2
    p.threads._send_fins(True)
    assert conn.written == [b"FIN " + MID + b"\nFIN " + MID2 + b"\n"]
    assert (p.answers.finished, sub.in_flight) == (2, 0)


def test_options_are_checked_once_and_shared() -> None:
    options = Options("t", "c", None, nsqd_tcp_addresses=["a:1", "a:1"], max_in_flight=300)
    assert options.direct == ["a:1"] and options.workers == 100 and not options.async_handler
    assert Options("t", "c", None, nsqd_tcp_addresses=["a:1"], concurrency=3).workers == 3
