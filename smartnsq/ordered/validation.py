"""Checking that an ordered partition never goes backwards."""

from __future__ import annotations


class OrderChecker:
    """Per partition: internal id and queue offset must never decrease.

    Equal values are a redelivery (allowed); a smaller one is a violation.
    """

    __slots__ = ("last_id", "last_offset", "violations")

    def __init__(self) -> None:
        self.last_id = -1
        self.last_offset = -1
        self.violations = 0

    def check(self, internal_id: int, offset: int | None) -> bool:
        """Record a delivery; return False if it went backwards."""
        back = internal_id < self.last_id or (
            offset is not None and self.last_offset >= 0 and offset < self.last_offset
        )
        if back:
            self.violations += 1
            return False
        self.last_id = internal_id
        if offset is not None:
            self.last_offset = offset
        return True
