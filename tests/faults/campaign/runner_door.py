"""The runner front door: ``python -m tests.faults.campaign.runner_door TOPIC CHANNEL LOOKUPD
FILE`` consumes with ``smartnsq.run`` until SIGINT or SIGTERM; each body is appended to FILE
and fsynced before the handler returns (so FIN means "in the file")."""

from __future__ import annotations

import os
import sys

import smartnsq


def main(topic: str, channel: str, lookupd: str, path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def handle(message: smartnsq.Message) -> None:
        os.write(fd, message.body + b"\n")
        os.fsync(fd)

    consumer = smartnsq.Consumer(
        topic,
        channel,
        handle,
        lookupd_http_addresses=lookupd.split(","),
        msg_timeout=3.0,
        heartbeat_interval=1.0,
        reconnect_max=1.0,
        lookupd_poll_interval=1.0,
    )
    smartnsq.run(consumer)


if __name__ == "__main__":
    main(*sys.argv[1:5])
