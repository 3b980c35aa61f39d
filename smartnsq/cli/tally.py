"""What ``smartnsq pub`` has done so far: shared by the publisher and its progress bar."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Tally"]


@dataclass
class Tally:
    """What happened to the lines read so far."""

    read: int = 0
    published: int = 0
    failed: int = 0
    skipped: int = 0  # empty lines: nsqd rejects empty messages
    resumed: int = 0  # lines before --resume-from: left out on purpose
    unconfirmed: int = 0  # sent, but the answer was cut short by a second Ctrl-C
    # The resume point: every line up to this one (``source:line``) was acknowledged by nsqd
    # (or skipped as empty); empty when not one line was.
    position: str = ""
    # Lines acknowledged after the first one that was not: published again on a resume.
    beyond: int = 0
    interrupted: bool = False
    gave_up: bool = False
