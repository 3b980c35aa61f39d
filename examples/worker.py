"""A worker process: consume a topic until Ctrl-C or SIGTERM, then stop cleanly.

    python examples/worker.py events archive --nsqd 127.0.0.1:4150
    python examples/worker.py events archive --lookupd 127.0.0.1:4161 --forward events.done

On SIGTERM (what ``kill``, systemd, Docker and Kubernetes send) or Ctrl-C the worker stops
taking messages, lets the handlers that are running finish (up to ``--stop-timeout`` seconds),
requeues what it had not started, closes its producer last and exits with status 0. Nothing
is left in flight in nsqd, so another worker gets those messages right away instead of after
nsqd's message timeout. A second signal cancels the handlers still running (their messages
are requeued too).
"""

from __future__ import annotations

import argparse
import logging

import anyio

import smartnsq
from smartnsq import Consumer, Message, Producer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topic")
    parser.add_argument("channel")
    parser.add_argument("--nsqd", action="append", default=[], help="nsqd TCP address")
    parser.add_argument("--lookupd", action="append", default=[], help="lookupd HTTP address")
    parser.add_argument("--forward", help="publish each handled body to this topic")
    parser.add_argument("--stop-timeout", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    producer = Producer(args.nsqd, lookupd_http_addresses=args.lookupd) if args.forward else None

    async def handle(message: Message) -> None:
        await anyio.sleep(0.5)  # stands for the real work
        print(message.body.decode(errors="replace"), flush=True)
        if producer is not None:  # still open while the consumer drains
            await producer.publish(args.forward, message.body)

    consumer = Consumer(
        args.topic,
        args.channel,
        handle,
        nsqd_tcp_addresses=args.nsqd,
        lookupd_http_addresses=args.lookupd,
        max_in_flight=20,
    )
    clients = [consumer] if producer is None else [consumer, producer]
    smartnsq.run(*clients, stop_timeout=args.stop_timeout)
    print("stopped:", consumer.stats())


if __name__ == "__main__":
    main()
