"""nsq_to_nsq's JSON filters for ``smartnsq to-nsq``: copy only the messages whose JSON has a
field (``--require-json-field``), with a value (``--require-json-value``), and of those only
some fields (``--whitelist-json-field``, repeatable)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

__all__ = ["JsonFilter", "json_filter_options"]

F = TypeVar("F", bound=Callable[..., Any])


def json_filter_options(fn: F) -> F:
    """The three flags (values reach the command as ``require_json_field``,
    ``require_json_value`` and ``whitelist_json_fields``)."""
    fn = click.option(
        "--whitelist-json-field",
        "whitelist_json_fields",
        multiple=True,
        metavar="FIELD",
        help="Copy only these top-level fields of each JSON message (repeatable); "
        "implies that only JSON objects are copied.",
    )(fn)
    fn = click.option(
        "--require-json-value",
        metavar="VALUE",
        help="With --require-json-field: only messages whose field is this string or number.",
    )(fn)
    fn = click.option(
        "--require-json-field",
        metavar="FIELD",
        help="Copy only JSON messages with this top-level field; the others are finished "
        "without a copy.",
    )(fn)
    return fn


class JsonFilter:
    """What to copy of a message: :meth:`apply` gives the body to publish, or None for a
    message that does not pass (finished, not copied, as nsq_to_nsq does)."""

    def __init__(self, field: str | None, value: str | None, whitelist: Sequence[str]) -> None:
        if value is not None and not field:
            raise click.UsageError("--require-json-value needs --require-json-field")
        self.field = field or None
        self.value = value or None
        self.whitelist = list(dict.fromkeys(whitelist))
        try:
            self.number: float | None = float(value) if value else None
        except ValueError:
            self.number = None
        self.skipped = 0  # messages that did not pass
        self.not_json = 0  # of them, those that were no JSON object

    @property
    def active(self) -> bool:
        return self.field is not None or bool(self.whitelist)

    def apply(self, body: bytes) -> bytes | None:
        if not self.active:
            return body
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            self.skipped += 1
            self.not_json += 1
            return None
        if not self._passes(doc):
            self.skipped += 1
            return None
        if not self.whitelist:
            return body  # unchanged, byte for byte
        kept = {k: _go_number(doc[k]) for k in self.whitelist if k in doc}
        # As Go's json.Marshal of a map: keys sorted, compact, UTF-8 as it is.
        return json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def _passes(self, doc: dict[str, Any]) -> bool:
        if self.field is None:
            return True
        if self.field not in doc:
            return False
        if self.value is None:
            return True
        found = doc[self.field]
        if isinstance(found, str):
            return found == self.value
        if isinstance(found, int | float) and not isinstance(found, bool):
            return self.number is not None and float(found) == self.number
        return False


def _go_number(value: Any) -> Any:
    """A whole float as an integer, as nsq_to_nsq writes it (``2.0`` becomes ``2``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
