"""The exporter's own metric families and the private registry that writes them.

prometheus-client renders this part of the exposition: its ProcessCollector reports
the standard ``process_*`` metrics (memory, CPU seconds, start time, file descriptors,
read from /proc as in every other Python exporter) and ``generate_latest`` writes them
with the ``gpu_exporter_*`` families, once per cycle, in the text format 0.0.4. The
registry is private: nothing registers on prometheus-client's global one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric


class Family(Metric):
    """One metric family: ``kind`` is "gauge" or "counter" (samples named ``name_total``).

    ``labels`` are the label names; :meth:`add` takes one sample's label values in that
    order and its value.
    """

    def __init__(
        self,
        name: str,
        help_text: str,
        value: float | None = None,
        labels: Sequence[str] = (),
        kind: str = "gauge",
    ) -> None:
        super().__init__(name, help_text, kind)
        self.labels = tuple(labels)
        self._sample = self.name + "_total" if kind == "counter" else self.name
        if value is not None:
            self.add((), value)

    def add(self, values: Sequence[str], value: float) -> None:
        """One sample: label values in the order of ``labels``."""
        self.add_sample(self._sample, dict(zip(self.labels, values, strict=True)), value)


def counter(
    name: str, help_text: str, value: float | None = None, labels: Sequence[str] = ()
) -> Family:
    """A counter family (name without ``_total``)."""
    return Family(name, help_text, value, labels, kind="counter")


class _Own:
    """A prometheus-client collector over a function that yields the families."""

    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self.collect = families


class Registry:
    """The process metrics, then the families ``families()`` yields, rendered together.

    ``proc`` is the /proc to read the process metrics from; where it cannot be read
    they are left out (ProcessCollector's behaviour).
    """

    def __init__(self, families: Callable[[], Iterable[Metric]], proc: str = "/proc") -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(proc=proc, registry=self._registry)
        self._registry.register(_Own(families))

    def render(self) -> bytes:
        """Every family in the Prometheus text format 0.0.4, UTF-8."""
        return generate_latest(self._registry)
