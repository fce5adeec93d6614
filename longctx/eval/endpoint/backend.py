"""Run a (task, length) cell through an OpenAI-compatible server: N requests in flight.

    backend = EndpointBackend(client, "meta-llama/Llama-3.1-8B", mode="completions", concurrency=8)
    ran = backend.run_cell(samples, stop=flag, bar=bar)     # a runner.CellRun, as in process

completions: the sample's prompt text (our chat template applied, answer prefix last) to
/v1/completions; chat: the same text (built without a template of ours) as one user message to
/v1/chat/completions, which the server wraps in its own template. Greedy (temperature 0), the
task's generation budget as max_tokens; the stop strings cut the returned text here, as the
in-process runner cuts its own (a server would stop at a stop string at the very start, where
answers that follow a newline begin).

A SIGTERM (`stop`) sends no new request and sets `abort`: those in flight finish without another
try (one that fails then is left for the rerun, not a failure). A request that fails for good --
client.py's retries spent, refused, or anything else raised while sending it or reading its
answer -- sets `failure` (its reason in words, credentials masked) and `abort`: nothing new is
sent, the others give up their retries, and the cell ends with what finished, which the caller
writes as a partial cell (eval/api.py), so a rerun sends only the rest.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Optional, Sequence

from longctx.eval.endpoint.client import EndpointClient, EndpointError
from longctx.eval.runner import CellRun, cut_at_stops, sample_record
from longctx.eval.tasks import Sample
from longctx.reporting.progress import Progress

POLL_S = 0.25  # how often the loop looks for a signal while requests are in flight


@dataclass
class Answer:
    text: str
    prompt_tokens: int  # as the server counted them (our count when it does not say)
    new_tokens: int


@dataclass
class EndpointBackend:
    """Where the samples go, and how many at once."""

    client: EndpointClient
    model: str
    mode: str = "completions"
    concurrency: int = 8
    failure: Optional[str] = None  # why the eval stopped: a request that failed for good
    refused: bool = False  # the server refused that request (a 4xx): retrying would not help
    broken: bool = False  # its answer or the transport broke (a body, a proxy): not the server being down
    totals: dict = field(default_factory=lambda: {"requests": 0, "prompt_tokens": 0, "new_tokens": 0})
    _started: Optional[float] = None

    def body(self, sample: Sample) -> dict:
        if self.mode == "chat":
            return {"model": self.model, "messages": [{"role": "user", "content": sample.prompt}],
                    "max_tokens": sample.max_new_tokens, "temperature": 0.0}
        return {"model": self.model, "prompt": sample.prompt, "max_tokens": sample.max_new_tokens,
                "temperature": 0.0}

    def complete(self, sample: Sample, abort: Optional[threading.Event] = None) -> Answer:
        """One sample's greedy continuation (EndpointError when it failed for good)."""
        path = "chat/completions" if self.mode == "chat" else "completions"
        answer = self.client.post(path, self.body(sample), abort=abort)
        where, mask = f"{self.client.url}/{path}", self.client.mask
        try:
            choice = answer["choices"][0]
            text = choice["message"]["content"] if self.mode == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"{where}: an answer without choices ({mask(str(answer)[:120])})",
                                retryable=False) from None
        usage = answer.get("usage") or {}
        if text is not None and not isinstance(text, str):
            raise EndpointError(f"{where}: an answer whose text is not a string ({mask(repr(text)[:80])})",
                                retryable=False)
        if not isinstance(usage, dict):
            raise EndpointError(f"{where}: an answer whose usage is not an object ({mask(repr(usage)[:80])})",
                                retryable=False)
        prompt_tokens, new_tokens = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        return Answer(text or "", sample.prompt_tokens if prompt_tokens is None else prompt_tokens, new_tokens or 0)

    def layout(self) -> dict:
        """How a cell was computed (recorded in it, not part of its key)."""
        return {"endpoint": self.client.url, "concurrency": self.concurrency, "device": "endpoint"}

    def rates(self) -> dict:
        """The progress bar's fields: requests and tokens (prompt and generated) per second so far."""
        elapsed = max(time.monotonic() - (self._started or time.monotonic()), 1e-9)
        t = self.totals
        return {"req/s": f"{t['requests'] / elapsed:.2f}",
                "tok/s": f"{(t['prompt_tokens'] + t['new_tokens']) / elapsed:,.0f}",
                "gen tok/s": f"{t['new_tokens'] / elapsed:,.1f}"}

    def run_cell(self, samples: Sequence[Sample], *, stop=None, bar: Optional[Progress] = None) -> CellRun:
        """Every sample given (or, after a stop or a failure, those that finished), as runner.run_cell."""
        t0 = time.monotonic()
        self._started = self._started or t0
        abort = threading.Event()  # set: no new request and no more tries (a failure, or a signal)
        queue = list(sorted(samples, key=lambda s: (s.prompt_tokens, s.index)))[::-1]  # pop() takes the shortest
        records: list = []
        stats = {"prompt_tokens": 0, "new_tokens": 0, "peak_cache_bytes": 0, "seconds": 0.0}
        in_flight: dict[Future, Sample] = {}
        stopping = False
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="longctx-endpoint") as pool:
            try:
                while True:
                    while queue and not abort.is_set() and self.failure is None and len(in_flight) < self.concurrency:
                        sample = queue.pop()
                        in_flight[pool.submit(self.complete, sample, abort)] = sample
                    if not in_flight:
                        break
                    done, _ = wait(in_flight, timeout=POLL_S, return_when=FIRST_COMPLETED)
                    for future in done:
                        sample = in_flight.pop(future)
                        answer = self._answer(future, sample, stopping, abort)
                        if answer is not None:
                            records.append(sample_record(sample, cut_at_stops(answer.text, sample.stop)))
                            self._add(stats, answer)
                            if bar is not None:
                                bar.update(1, **self.rates())
                    if not stopping and stop is not None and stop.agreed():
                        stopping = True  # a signal: no new request, no more tries; those in flight finish
                        abort.set()
            except BaseException:
                abort.set()  # an interrupt: the threads give up their tries before the pool is joined
                raise
        stats["seconds"] = time.monotonic() - t0
        finished = not queue and len(records) == len(samples)
        return CellRun(sorted(records, key=lambda r: r["index"]), stats, finished,
                       stopping or self.failure is not None)

    def _answer(self, future: Future, sample: Sample, stopping: bool, abort: threading.Event) -> Optional[Answer]:
        """The request's answer; None when it failed (abort set; the first failure recorded)."""
        try:
            return future.result()
        except EndpointError as e:
            reason, retryable, status = e.reason, e.retryable, e.status or 0
        except Exception as e:  # noqa: BLE001 - whatever it was, the cell keeps what finished
            reason, retryable, status = self.client.mask(f"{self.client.url}: {type(e).__name__}: {e}"), False, 0
        abort.set()
        if self.failure is None and not (stopping and retryable):  # after a signal, a lost request is the rerun's
            self.failure = f"{sample.task} at {sample.target_length}, sample {sample.index}: {reason}"
            self.refused = not retryable and status >= 400
            self.broken = not retryable and not self.refused
        return None

    def _add(self, stats: dict, answer: Answer) -> None:
        stats["prompt_tokens"] += answer.prompt_tokens
        stats["new_tokens"] += answer.new_tokens
        self.totals["requests"] += 1
        self.totals["prompt_tokens"] += answer.prompt_tokens
        self.totals["new_tokens"] += answer.new_tokens


def _count(value) -> Optional[int]:
    """A usage count as the server gave it (an int), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
