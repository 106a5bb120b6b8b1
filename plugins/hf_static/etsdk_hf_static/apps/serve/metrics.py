"""The server's counters, and their Prometheus text (``GET /metrics``). Thread-safe; imports nothing heavy."""

from __future__ import annotations

import threading

__all__ = ["METRICS", "Metrics"]

#: every metric: name -> (Prometheus type, help); names are prefixed ``etsdk_`` in the text
METRICS: dict[str, tuple[str, str]] = {
    "requests_total": ("counter", "HTTP requests answered, by route and status code"),
    "prompt_tokens_total": ("counter", "prompt tokens of the requests that started generating"),
    "prefill_tokens_total": ("counter", "prompt tokens computed (prefilled); the rest came from the prefix cache"),
    "completion_tokens_total": ("counter", "tokens generated"),
    "prefix_cache_hits_total": ("counter", "requests that continued from a slot's cached tokens"),
    "prefix_cache_tokens_total": ("counter", "prompt tokens reused from a slot instead of prefilled"),
    "slot_forks_total": ("counter", "requests whose slot was forked from a busy slot sharing their prefix"),
    "cancelled_total": ("counter", "requests stopped because the client went away"),
    "rejected_total": ("counter", "requests refused with 503 because every slot was busy and the queue full"),
    "decode_seconds_total": ("counter", "seconds requests spent in decode steps (a decode_batch call counts for each request in it)"),
    "decode_tokens_total": ("counter", "tokens chosen by decode steps (a request's decode tokens/s = this / decode_seconds_total)"),
    "decode_batch_calls_total": ("counter", "decode_batch calls: one decode step for several requests at once"),
    "decode_batch_rows_total": ("counter", "requests' decode steps run in decode_batch calls (rows / calls: requests per call)"),
    "time_to_first_token_seconds": ("summary", "from a request's arrival in the queue to its first token"),
    "queue_depth": ("gauge", "requests waiting for a slot"),
    "slots_busy": ("gauge", "slots generating now"),
    "slots": ("gauge", "slots (conversations) of the program"),
}


class Metrics:
    """Counters, gauges and summaries named in :data:`METRICS` (an unknown name is a programming error)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}
        self._labelled: dict[tuple[str, str, int], float] = {}
        self._summaries: dict[str, tuple[float, int]] = {}

    def count(self, name: str, value: float = 1) -> None:
        assert METRICS[name][0] == "counter", name
        with self._lock:
            self._values[name] = self._values.get(name, 0) + value

    def set(self, name: str, value: float) -> None:
        assert METRICS[name][0] == "gauge", name
        with self._lock:
            self._values[name] = value

    def observe(self, name: str, value: float) -> None:
        assert METRICS[name][0] == "summary", name
        with self._lock:
            total, count = self._summaries.get(name, (0.0, 0))
            self._summaries[name] = (total + value, count + 1)

    def request(self, route: str, status: int) -> None:
        with self._lock:
            key = ("requests_total", route, status)
            self._labelled[key] = self._labelled.get(key, 0) + 1

    def value(self, name: str) -> float:
        """A counter's or gauge's value (a summary's count), 0 before anything was recorded."""
        with self._lock:
            if name in self._summaries:
                return self._summaries[name][1]
            return self._values.get(name, 0)

    def text(self) -> str:
        """Every metric in the Prometheus text format (version 0.0.4)."""
        lines = []
        with self._lock:
            for name, (kind, help_text) in METRICS.items():
                full = f"etsdk_{name}"
                lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
                if name == "requests_total":
                    for (_, route, status), value in sorted(self._labelled.items()):
                        lines.append(f'{full}{{route="{route}",code="{status}"}} {value:g}')
                elif kind == "summary":
                    total, count = self._summaries.get(name, (0.0, 0))
                    lines += [f"{full}_sum {total:.6f}", f"{full}_count {count}"]
                else:
                    lines.append(f"{full} {self._values.get(name, 0):g}")
        return "\n".join(lines) + "\n"
