"""Pod label text is kept for the pods on the node now, not for every pod ever seen."""

from __future__ import annotations

import tracemalloc

from exporter.exposition.pods import HolderText
from exporter.frame import Holder, Owner


def layout(generation: int, n: int = 60) -> dict[str, Holder]:
    """n devices, each held by a container of a pod that exists in this generation only."""
    return {
        f"GPU-{i}": Holder(
            Owner("team-a", f"train-{generation}-{i}-{'x' * 40}", "main"),
            pod_uid=f"{generation:08d}-{i:04d}-0000-0000-000000000000",
        )
        for i in range(n)
    }


def test_label_text_of_each_holder():
    texts = HolderText().by_device(layout(7, 2))
    assert texts["GPU-1"] == (
        f'pod="train-7-1-{"x" * 40}",namespace="team-a",container="main",'
        'pod_uid="00000007-0001-0000-0000-000000000000"'
    )


def test_pods_replaced_all_day_do_not_accumulate():
    # 60 pods replaced at every layout: the text of gone pods must go with them. A cache
    # bounded only by its size (4,096 holders) held about 2 MiB here.
    text = HolderText()
    layouts = [layout(g) for g in range(400)]
    text.by_device(layouts[0])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for holders in layouts[1:]:
            text.by_device(holders)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"label text grew by {grown} bytes over 400 layouts"


def test_text_of_unchanged_holders_is_reused():
    text = HolderText()
    holders = layout(1)
    first = text.by_device(holders)
    again = text.by_device(dict(holders))
    assert all(again[k] is first[k] for k in holders)  # the same strings, not joined again
