"""Discovery through nsqlookupd: classic and Youzan answers in one topic-layout model."""

from smartnsq.lookup.client import check_lookupd_addresses, fetch_lookup, normalize_lookupd_address
from smartnsq.lookup.model import Node, TopicLayout, TopicMeta, parse_lookup, unwrap

__all__ = [
    "Node",
    "TopicLayout",
    "TopicMeta",
    "check_lookupd_addresses",
    "fetch_lookup",
    "normalize_lookupd_address",
    "parse_lookup",
    "unwrap",
]
