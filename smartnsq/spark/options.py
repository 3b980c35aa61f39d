"""The options of the ``nsq`` Spark data source: checked, typed and turned into client settings.

Spark hands a data source its options as strings under lower-cased keys. Everything here runs
on the driver while the query is planned, so a mistake fails the query before any task runs,
with a :mod:`smartnsq.errors` exception that names the option to change.

This module does not import pyspark.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from smartnsq.errors import InvalidArgument, InvalidType, NSQError
from smartnsq.lookup.client import check_lookupd_addresses
from smartnsq.net.connection import parse_address
from smartnsq.protocol.names import validate_channel, validate_topic
from smartnsq.spark.spec import Spec, parse_spec, parse_time

PASSTHROUGH = "nsq."

# Options Spark itself may add to a data source's options; they are not ours to check.
_SPARK_OWN = frozenset({"path", "checkpointlocation", "queryname"})

_COMMON = ("lookupd", "nsqd", "topic")
WRITE_OPTIONS = (*_COMMON, "ignoreExtraColumns", "batchSize")
# Options that only a replayable (Youzan partitioned) topic can honour.
OFFSET_OPTIONS = (
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "partitionsPerTask",
)
READ_OPTIONS = (
    *_COMMON,
    "channel",
    "maxMessagesPerTrigger",
    "maxMessages",
    "idleTimeoutMs",
    "pollTimeoutMs",
    "touchIntervalMs",
    # Youzan partitioned topics (see smartnsq.spark.youzan_reader)
    "clusterKind",
    *OFFSET_OPTIONS,
)
CLUSTER_KINDS = ("auto", "classic", "youzan")

# Keyword arguments that the data source sets itself, or that need a Python object.
_NOT_PASSED = frozenset(
    {
        "self",
        "topic",
        "channel",
        "handler",
        "nsqd_tcp_addresses",
        "lookupd_http_addresses",
        "identify",
        "on_giving_up",
        "on_order_violation",
        "on_blocked",
    }
)

DEFAULT_BATCH_SIZE = 10_000  # messages per MPUB, at most: publish_many splits by size too
DEFAULT_MAX_PER_TRIGGER = 10_000
DEFAULT_MAX_MESSAGES = 100_000
DEFAULT_IDLE_TIMEOUT_MS = 2_000
DEFAULT_POLL_TIMEOUT_MS = 100
# Youzan reads: each task reads through a channel of its own, named after this prefix.
DEFAULT_CHANNEL_PREFIX = "spark"
DEFAULT_PARTITIONS_PER_TASK = 2  # Youzan reads: partitions one task reads at once


@dataclass(frozen=True)
class Settings:
    """Checked options. Picklable: it travels with readers and writers to the tasks."""

    nsqd: tuple[str, ...] = ()
    lookupd: tuple[str, ...] = ()
    topic: str | None = None
    channel: str | None = None
    client: tuple[tuple[str, Any], ...] = ()  # keyword arguments for Producer/Consumer
    ignore_extra_columns: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    max_per_trigger: int = DEFAULT_MAX_PER_TRIGGER
    max_messages: int = DEFAULT_MAX_MESSAGES
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_MS / 1000
    poll_timeout: float = DEFAULT_POLL_TIMEOUT_MS / 1000
    touch_interval: float | None = None
    cluster_kind: str = "auto"
    starting_offsets: Spec | None = field(default=None, compare=False)
    ending_offsets: Spec | None = field(default=None, compare=False)
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    partitions_per_task: int = DEFAULT_PARTITIONS_PER_TASK
    offset_options: tuple[str, ...] = ()  # which of OFFSET_OPTIONS were given
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def channel_prefix(self) -> str:
        """Youzan reads: what the channels of the tasks (and time look-ups) are named after."""
        return self.channel or DEFAULT_CHANNEL_PREFIX

    def addresses(self) -> dict[str, Any]:
        """The address keyword arguments of Producer and Consumer."""
        return {
            "nsqd_tcp_addresses": list(self.nsqd),
            "lookupd_http_addresses": list(self.lookupd),
        }

    def client_kwargs(self) -> dict[str, Any]:
        return {**self.addresses(), **dict(self.client)}


def _canonical(allowed: tuple[str, ...]) -> dict[str, str]:
    return {name.lower(): name for name in allowed}


def _split(option: str, value: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in value.split(",") if p.strip())
    if not parts:
        raise InvalidArgument(
            f"option {option!r} is empty: give one or more comma-separated addresses"
        )
    return parts


def _positive_int(option: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise InvalidArgument(f"option {option!r} must be a whole number, not {value!r}") from None
    if number < 1:
        raise InvalidArgument(f"option {option!r} must be >= 1, not {number}")
    return number


def parse_bool(option: str, value: str) -> bool:
    text = value.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {option!r} must be true or false, not {value!r}")


def _converters(annotation: Any) -> list[Callable[[str, str], Any]]:
    """String converters for a parameter annotation, most specific first ([] = not settable)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        out: list[Callable[[str, str], Any]] = []
        for arg in typing.get_args(annotation):
            out.extend(_converters(arg))
        # bool before int before float before str: "1" for `int | None` is an int, not text.
        order: dict[Callable[[str, str], Any], int] = {
            parse_bool: 0,
            _to_int: 1,
            _to_float: 2,
            _to_str: 3,
        }
        return sorted(out, key=lambda f: order.get(f, 4))
    if origin is Literal:
        choices = typing.get_args(annotation)

        def choose(option: str, value: str) -> Any:
            if value in choices:
                return value
            raise InvalidArgument(
                f"option {option!r} must be one of {', '.join(map(str, choices))}, not {value!r}"
            )

        return [choose] if all(isinstance(c, str) for c in choices) else []
    simple: dict[Any, list[Callable[[str, str], Any]]] = {
        bool: [parse_bool],
        int: [_to_int],
        float: [_to_float],
        str: [_to_str],
    }
    return simple.get(annotation, [])


def _to_int(option: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidArgument(f"option {option!r} must be a whole number, not {value!r}") from None


def _to_float(option: str, value: str) -> float:
    try:
        return float(value.strip())
    except ValueError:
        raise InvalidArgument(f"option {option!r} must be a number, not {value!r}") from None


def _to_str(option: str, value: str) -> str:
    return value


def client_parameters(cls: type) -> dict[str, list[Callable[[str, str], Any]]]:
    """The keyword arguments of ``cls.__init__`` that can be given as ``nsq.<name>`` options,
    each with its string converters (tried in order)."""
    signature = inspect.signature(cls, eval_str=True)
    out = {}
    for name, param in signature.parameters.items():
        if name in _NOT_PASSED or param.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        converters = _converters(param.annotation)
        if converters:
            out[name] = converters
    return out


def _convert(option: str, value: str, converters: list[Callable[[str, str], Any]]) -> Any:
    first: InvalidArgument | None = None
    for convert in converters:
        try:
            return convert(option, value)
        except InvalidArgument as exc:
            first = first or exc
    assert first is not None
    raise first


def parse(options: Mapping[str, str], *, reading: bool, client: type) -> Settings:
    """Check Spark's ``options`` for a read (``reading``) or a write and return them typed.

    ``client`` is :class:`~smartnsq.Consumer` for reads and :class:`~smartnsq.Producer` for
    writes: ``nsq.<name>`` options become its keyword argument ``<name>``, converted to the
    type its signature declares.
    """
    allowed = _canonical(READ_OPTIONS if reading else WRITE_OPTIONS)
    other = _canonical(WRITE_OPTIONS if reading else READ_OPTIONS)
    params = client_parameters(client)
    values: dict[str, str] = {}
    client_kwargs: dict[str, Any] = {}
    extra: dict[str, str] = {}
    for raw_key, raw_value in options.items():
        key = raw_key.lower()
        value = "" if raw_value is None else str(raw_value)
        if key in _SPARK_OWN:
            extra[key] = value
        elif key.startswith(PASSTHROUGH):
            name = key[len(PASSTHROUGH) :]
            if name not in params:
                raise InvalidArgument(
                    f"unknown option {raw_key!r}: {client.__name__} has no setting {name!r} "
                    f"that can be given as a string (known: "
                    f"{', '.join(PASSTHROUGH + p for p in sorted(params))})"
                )
            client_kwargs[name] = _convert(raw_key, value, params[name])
        elif key in allowed:
            values[allowed[key]] = value
        elif key in other:
            raise InvalidArgument(
                f"option {other[key]!r} applies only to "
                f"{'writing' if reading else 'reading'}: remove it"
            )
        else:
            raise InvalidArgument(
                f"unknown option {raw_key!r}: the nsq data source takes "
                f"{', '.join(sorted(allowed.values()))} and nsq.<setting>"
            )
    nsqd = _split("nsqd", values["nsqd"]) if "nsqd" in values else ()
    lookupd = _split("lookupd", values["lookupd"]) if "lookupd" in values else ()
    if not nsqd and not lookupd:
        raise InvalidArgument(
            "set option 'lookupd' (nsqlookupd HTTP addresses, comma-separated) or "
            "'nsqd' (nsqd TCP addresses, comma-separated)"
        )
    for address in nsqd:
        try:
            parse_address(address)
        except InvalidArgument as exc:
            raise InvalidArgument(f"option 'nsqd': {exc}") from None
    try:
        lookupd = tuple(check_lookupd_addresses(list(lookupd)))
    except NSQError as exc:
        raise InvalidArgument(f"option 'lookupd': {exc}") from None
    topic = values.get("topic")
    path = extra.get("path")
    if path:  # load("events") / save("events") name the topic too
        if topic is not None and topic != path:
            raise InvalidArgument(
                f"topic {topic!r} given as an option and {path!r} as the path: give one"
            )
        topic = path
    if topic is not None:
        try:
            validate_topic(topic)
        except NSQError as exc:
            raise InvalidArgument(f"option 'topic': {exc}") from None
    channel = values.get("channel")
    if reading:
        if topic is None:
            raise InvalidArgument("set option 'topic': the topic to read")
        # A channel is required on classic clusters only: see require_channel.
        if channel is not None:
            try:
                validate_channel(channel)
            except NSQError as exc:
                raise InvalidArgument(f"option 'channel': {exc}") from None
    settings = Settings(
        nsqd=nsqd,
        lookupd=lookupd,
        topic=topic,
        channel=channel,
        client=tuple(sorted(client_kwargs.items())),
        extra=extra,
        **_tuning(values),
        **(_offsets(values, topic) if reading and topic is not None else {}),
    )
    _check_client(settings, client)
    return settings


def _tuning(values: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "ignoreExtraColumns" in values:
        out["ignore_extra_columns"] = parse_bool("ignoreExtraColumns", values["ignoreExtraColumns"])
    if "batchSize" in values:
        out["batch_size"] = _positive_int("batchSize", values["batchSize"])
    if "maxMessagesPerTrigger" in values:
        out["max_per_trigger"] = _positive_int(
            "maxMessagesPerTrigger", values["maxMessagesPerTrigger"]
        )
    if "maxMessages" in values:
        out["max_messages"] = _positive_int("maxMessages", values["maxMessages"])
    for option, name in (
        ("idleTimeoutMs", "idle_timeout"),
        ("pollTimeoutMs", "poll_timeout"),
        ("touchIntervalMs", "touch_interval"),
    ):
        if option in values:
            out[name] = _positive_int(option, values[option]) / 1000
    return out


def _offsets(values: dict[str, str], topic: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "offset_options": tuple(o for o in OFFSET_OPTIONS if o in values),
    }
    kind = values.get("clusterKind", "auto").strip().lower()
    if kind not in CLUSTER_KINDS:
        raise InvalidArgument(
            f"option 'clusterKind' must be one of {', '.join(CLUSTER_KINDS)}, "
            f"not {values['clusterKind']!r}"
        )
    out["cluster_kind"] = kind
    for option, by_time, name, ending in (
        ("startingOffsets", "startingTimestamp", "starting_offsets", False),
        ("endingOffsets", "endingTimestamp", "ending_offsets", True),
    ):
        if by_time in values:
            if option in values:
                raise InvalidArgument(f"give option {option!r} or {by_time!r}, not both")
            out[name] = parse_time(by_time, values[by_time])
        elif option in values:
            out[name] = parse_spec(option, values[option], topic, ending=ending)
    if "maxOffsetsPerTrigger" in values:
        out["max_offsets_per_trigger"] = _positive_int(
            "maxOffsetsPerTrigger", values["maxOffsetsPerTrigger"]
        )
    if "failOnDataLoss" in values:
        out["fail_on_data_loss"] = parse_bool("failOnDataLoss", values["failOnDataLoss"])
    if "partitionsPerTask" in values:
        out["partitions_per_task"] = _positive_int("partitionsPerTask", values["partitionsPerTask"])
    return out


def require_channel(settings: Settings) -> None:
    """Reading a classic cluster consumes a channel: the user must name it."""
    if settings.channel is None:
        raise InvalidArgument("set option 'channel': the channel to consume")


def _check_client(settings: Settings, client: type) -> None:
    """Build (never start) the client once, so that its own checks run now, on the driver."""
    args: tuple[str, ...] = ()
    if "channel" in inspect.signature(client).parameters:  # a Consumer
        args = (settings.topic or "", settings.channel_prefix)
    try:
        client(*args, **settings.client_kwargs())
    except (InvalidArgument, InvalidType) as exc:
        raise type(exc)(
            f"bad nsq.<setting> option (settings are {client.__name__}'s keyword arguments): {exc}"
        ) from None
