"""Tag dispatch of the Youzan fork, sans-IO.

A message published with the ext header ``##client_dispatch_tag`` goes to the consumers of
the channel that IDENTIFYed with that ``desired_tag`` (to the untagged ones while there is
none). nsqd honours both only on ext topics; elsewhere it drops the consumer's tag silently
and refuses the publish's header (``E_EXT_NOT_SUPPORT``).
"""

from __future__ import annotations

import re

from smartnsq.errors import InvalidTag, InvalidType, TagNotSupported

TAG_KEY = "##client_dispatch_tag"
MAX_TAG_LEN = 100  # nsqd's ext.MAX_TAG_LEN
_VALID = re.compile(r"[a-zA-Z0-9_-]+")  # nsqd's ext.ValidateTag


def check_tag(name: str, tag: object) -> str:
    """``tag`` checked against nsqd's own rule: 1-100 ASCII letters, digits, '_' or '-'."""
    if not isinstance(tag, str):
        raise InvalidType(f"{name} must be a str, not {type(tag).__name__}")
    if not tag or len(tag) > MAX_TAG_LEN or not _VALID.fullmatch(tag):
        raise InvalidTag(
            f"{name} must be 1-{MAX_TAG_LEN} ASCII letters, digits, '_' or '-', not {tag!r}"
        )
    return tag


def check_tag_subscription(topic: str, tag: str, youzan: bool, ext: bool) -> None:
    """Refuse to subscribe with ``tag`` where nsqd would ignore it and deliver everything."""
    if not youzan:
        raise TagNotSupported(
            TagNotSupported.code,
            f"classic nsqd has no tag dispatch; drop desired_tag to consume {topic!r}",
        )
    if not ext:
        raise TagNotSupported(
            TagNotSupported.code,
            f"topic {topic!r} is not an ext topic, so nsqd would ignore desired_tag={tag!r} "
            "and deliver every message",
        )
