"""Which reader a query gets: replayable (Youzan partitioned topic) or classic.

``clusterKind=auto`` (the default) asks lookupd: a topic it reports with partitions is read
by offsets; anything else (classic lookupd, ``nsqd`` addresses only) by the classic
consuming reader, unchanged. ``clusterKind=youzan`` / ``classic`` force the choice. A classic
read fails here if no nsqd it would read from can be reached (see :mod:`~smartnsq.spark.reach`).

This module does not import pyspark.
"""

from __future__ import annotations

from smartnsq.errors import InvalidArgument
from smartnsq.lookup.model import TopicLayout
from smartnsq.spark import offsets_plan as plan
from smartnsq.spark import reach, youzan
from smartnsq.spark.options import Settings, require_channel


def check_kind(settings: Settings) -> bool:
    """True if the topic is read by offsets; every option is checked against that choice."""
    assert settings.topic is not None
    kind = settings.cluster_kind
    layout: TopicLayout | None = None
    asked = False
    if kind == "auto":
        if settings.lookupd:
            layout, asked = reach.lookup(settings), True
            kind = "youzan" if layout is not None and layout.partitioned else "classic"
            why = f"lookupd reports topic {settings.topic!r} without partitions (classic)"
        else:
            kind = "classic"
            why = "without option 'lookupd' the topic is read as a classic one"
    else:
        why = "clusterKind=classic"
    if kind == "classic":
        if settings.offset_options:
            raise InvalidArgument(
                f"option {settings.offset_options[0]!r} needs a Youzan partitioned topic, "
                f"read through option 'lookupd'; {why}"
            )
        require_channel(settings)
        if settings.lookupd and not asked:
            layout = reach.lookup(settings)
        reach.check_classic(settings, layout)
        return False
    if not settings.lookupd:
        raise InvalidArgument(
            "clusterKind=youzan needs option 'lookupd': it finds each partition's leader"
        )
    plan_check(settings)
    return True


def check_stream(settings: Settings) -> None:
    if settings.ending_offsets is not None:
        name = plan.option_name(settings.ending_offsets, ending=True)
        raise InvalidArgument(
            f"option {name!r} applies to spark.read only: a stream has no end "
            "(use trigger(availableNow=True) to stop after what is there)"
        )


def plan_check(settings: Settings) -> None:
    """Resolve the offset options against the cluster now, so that a mistake (an unknown
    partition, an offset past the end) fails the query while Spark plans it."""
    assert settings.topic is not None
    infos = youzan.partitions(settings.lookupd, settings.topic)
    start = plan.resolve_start(settings, infos, "earliest")
    end = plan.resolve_end(settings, infos)
    plan.check_retained(start, infos, settings.fail_on_data_loss)
    for p, s in start.items():
        if settings.ending_offsets is not None and end[p] < s:
            name = plan.option_name(settings.ending_offsets, ending=True)
            raise InvalidArgument(
                f"option {name!r}: partition {p} ends at {end[p]}, before its starting offset {s}"
            )
