"""Credentials kept out of every line: a URL's user:key, the API key and any other secret given.

    masked = Masker(url="https://user:key@host/v1", secrets=[api_key])
    masked.url                          # https://***@host/v1
    masked("HTTP 401: bad key for https://user:key@host")   # HTTP 401: bad key for https://***@host

A URL's userinfo (`scheme://user:pass@`) anywhere in a text is replaced, whoever wrote it (our
messages, the server's own error text, a proxy's); the literal secrets too, where they appear
without the URL (a server that echoes the key it was sent).
"""
from __future__ import annotations

import re
from typing import Iterable, Optional
from urllib.parse import unquote, urlsplit

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@?#]+@")


def mask_userinfo(text: str) -> str:
    """Every `scheme://user:pass@` (or `scheme://user@`) in `text` as `scheme://***@`."""
    return _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)


class Masker:
    """Masks `url`'s userinfo and the given secrets (and their URL-decoded forms) in any text."""

    def __init__(self, url: str = "", secrets: Iterable[Optional[str]] = ()):
        parts = urlsplit(url) if url else None
        # the password; a URL with a user name only (https://TOKEN@host) carries its token there
        found = [(parts.password or parts.username) if parts is not None else None]
        raw = [s for s in (*found, *secrets) if s]
        forms = {form.strip() for s in raw for form in (s, unquote(s), repr(s)[1:-1])}  # as quoted or escaped
        self._secrets = sorted((s for s in forms if len(s) >= 3), key=len, reverse=True)  # 1-2: common words
        self.url = self(url)

    def __call__(self, text: str) -> str:
        text = mask_userinfo(text)
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text
