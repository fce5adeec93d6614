"""HTTP to an OpenAI-compatible server: one request, retried where retrying can help.

    client = EndpointClient("http://localhost:8000/v1", api_key=os.environ.get("OPENAI_API_KEY"),
                            timeout_s=600, retries=5)
    client.get("models")                          # JSON, or EndpointError
    client.post("completions", {...}, abort=ev)   # retried on 429, 5xx, timeouts and lost connections

A 429 or 5xx answer, a timeout and a refused or dropped connection are retried with exponential
backoff (1 s, 2 s, 4 s, ... at most 30 s, or the server's Retry-After); any other 4xx is the
request's own fault and is not, and neither is any other transport or protocol error (a body
that does not decode, a proxy's refusal, a request httpx cannot send): every failure is an
EndpointError, never another exception. The API key goes in the Authorization header only; the
URL's user:key, the key and the server's own words pass through masking.Masker before any
message holds them (`client.url` is the masked URL).
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import httpx

from longctx.eval.endpoint.masking import Masker

BACKOFF_S = 1.0
BACKOFF_MAX_S = 30.0
RETRY_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class EndpointError(Exception):
    """A request that failed for good: `reason` in words; `retryable` when more tries might have
    helped (the server is down or overloaded), false when the request itself was refused."""

    def __init__(self, reason: str, *, retryable: bool, status: Optional[int] = None):
        super().__init__(reason)
        self.reason, self.retryable, self.status = reason, retryable, status


def base_url(url: str) -> str:
    """The API root: http://host:8000, http://host:8000/ and http://host:8000/v1 all give .../v1."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def server_root(url: str) -> str:
    """The server's root (where llama.cpp's /props and TGI's /info are)."""
    return base_url(url)[: -len("/v1")]


def _detail(response: httpx.Response) -> str:
    """The server's own words for a refused request (its JSON's message, else the text), short."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
    else:
        error = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(error, dict):
            error = error.get("message") or error.get("detail") or error
        detail = body.get("detail") if isinstance(body, dict) and "detail" in body else None
        text = str(detail if detail is not None else error)
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


class EndpointClient:
    """One connection pool to the server, shared by the threads that send requests. `url` and
    `root` are for messages (credentials masked); requests go to the URL as given."""

    def __init__(self, url: str, *, api_key: Optional[str] = None, timeout_s: float = 600.0, retries: int = 5,
                 concurrency: int = 8):
        self._url, self._root = base_url(url), server_root(url)
        self.mask = Masker(self._url, [api_key])
        self.url, self.root = self.mask.url, self.mask(self._root)
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max(concurrency, 1) + 2, max_keepalive_connections=max(concurrency, 1))
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
                                  limits=limits)

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, *, root: bool = False) -> dict:
        """GET <url>/<path> (root: <server root>/<path>) once: JSON, or EndpointError."""
        return self._send("GET", path, None, root)

    def post(self, path: str, body: dict, *, abort: Optional[threading.Event] = None,
             retries: Optional[int] = None, root: bool = False) -> dict:
        """POST <url>/<path> (root: <server root>/<path>), retried with backoff on what may pass;
        stops waiting when `abort` is set."""
        tries = (self.retries if retries is None else retries) + 1
        for attempt in range(tries):
            try:
                return self._send("POST", path, body, root)
            except EndpointError as e:
                if not e.retryable:
                    raise
                error, wait = e, getattr(e, "retry_after", None)
            if attempt + 1 == tries:
                break
            delay = min(BACKOFF_MAX_S, wait if wait is not None else BACKOFF_S * 2 ** attempt)
            if abort is not None:
                if abort.wait(delay):  # the eval is stopping: no more tries
                    break
            else:
                time.sleep(delay)
        raise error

    def _send(self, method: str, path: str, body: Optional[dict], root: bool) -> dict:
        """One request: its JSON, or EndpointError (retryable where another try may pass)."""
        where = f"{self.root if root else self.url}/{path}"
        try:
            response = self._http.request(method, f"{self._root if root else self._url}/{path}", json=body)
        except _TRANSIENT as e:
            raise EndpointError(f"{where}: {self.mask(_words(e))}", retryable=True) from None
        except (httpx.HTTPError, httpx.InvalidURL) as e:  # a body that does not decode, a proxy, a bad request
            raise EndpointError(f"{where}: {self.mask(_words(e))}", retryable=False) from None
        return _json_of(response, where, self.mask)


def _words(error: Exception) -> str:
    """A transport error in words (no URL repeated, no headers)."""
    if isinstance(error, httpx.TimeoutException):
        return f"no answer in time ({type(error).__name__})"
    if isinstance(error, httpx.ConnectError):
        return f"cannot connect ({str(error) or 'connection refused'})"
    if isinstance(error, httpx.DecodingError):
        return f"the answer's body does not decode ({type(error).__name__}: {error})"
    if isinstance(error, _TRANSIENT):
        return f"the connection broke ({type(error).__name__}: {error})" if str(error) else type(error).__name__
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _json_of(response: httpx.Response, where: str, mask: Masker) -> dict:
    if response.status_code >= 400:
        retryable = response.status_code in RETRY_STATUS
        error = EndpointError(f"{where}: HTTP {response.status_code}: {mask(_detail(response))}", retryable=retryable,
                              status=response.status_code)
        after = response.headers.get("retry-after")
        error.retry_after = float(after) if after and after.replace(".", "", 1).isdigit() else None
        raise error
    try:
        return response.json()
    except ValueError:
        raise EndpointError(f"{where}: the answer is not JSON ({mask(response.text[:80])!r})", retryable=False,
                            status=response.status_code) from None
