"""Topic and channel name rules, checked before anything is sent."""

from __future__ import annotations

import re

from smartnsq.errors import InvalidChannel, InvalidTopic, InvalidType

MAX_NAME_LENGTH = 64
_NAME = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def _check(kind: str, name: object, error: type[InvalidTopic] | type[InvalidChannel]) -> str:
    if not isinstance(name, str):
        raise InvalidType(f"{kind} name must be a str, not {type(name).__name__}")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise error(
            f"{kind} name {name!r} must be 1 to {MAX_NAME_LENGTH} characters long, not {len(name)}"
        )
    if not _NAME.fullmatch(name):
        raise error(
            f"{kind} name {name!r} may contain only letters, digits, '.', '_' and '-', "
            "optionally followed by '#ephemeral'"
        )
    return name


def validate_topic(name: object) -> str:
    """Return ``name`` if it is a valid topic name, else raise :class:`InvalidTopic`."""
    return _check("topic", name, InvalidTopic)


def validate_channel(name: object) -> str:
    """Return ``name`` if it is a valid channel name, else raise :class:`InvalidChannel`."""
    return _check("channel", name, InvalidChannel)
