"""URLs as tokpack shows, records and opens them: no message carries their user information."""

from __future__ import annotations

import re


def is_url(raw: str) -> bool:
    """Whether an input names a remote store (``scheme://``) rather than a local path."""
    scheme, sep, _ = raw.partition("://")
    return bool(sep) and scheme.replace("+", "").isalnum() and scheme != "file"


WEB = ("http", "https")  # URLs whose "?" starts a query and "#" a fragment; elsewhere both are a key's characters
# A URL's user information wherever it stands in a text: what no message may carry.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@]*@")
_SECRETS: set[str] = set()  # the user information of every URL opened, scrubbed from every message


def _split_userinfo(url: str) -> tuple[str, str, str]:
    """(scheme, user information, the rest) of a URL; user information "" where it has none. Only
    a web URL's host may hold ":" (a port), so elsewhere a ":" before the first "/" starts a secret
    that may itself hold "/" (AWS secret keys do)."""
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    if "@" in netloc or (":" in netloc and scheme not in WEB and "@" in rest):
        userinfo, _, host_on = rest.rpartition("@") if "@" not in netloc else rest.partition("@")
        return scheme, userinfo, host_on
    return scheme, "", rest


def redact(url: str) -> str:
    """``url`` as tokpack shows and records it: without user information, and a web URL without
    its query and fragment (where signed URLs carry their keys). An object's key stays whole:
    ``s3://b/a#b.jsonl`` and ``s3://b/a?b.jsonl`` are two objects."""
    if "://" not in url:
        return url
    scheme, _, rest = _split_userinfo(url)
    if scheme in WEB:
        rest = rest.split("#", 1)[0].split("?", 1)[0]
    return f"{scheme}://{rest}"


def scrub(text: str) -> str:
    """``text`` (a message, whoever wrote it) without the user information of any URL in it, nor
    of any URL tokpack opened (a library may quote a part of one: a bucket name, a host)."""
    text = _USERINFO.sub(r"\1", text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def check_url(raw: str) -> str:
    """``raw`` as tokpack opens it: a web URL's user information (HTTP basic authentication) is
    remembered so that no message shows it; any other store's credentials in a URL are refused,
    since its library would quote them in its errors."""
    scheme, userinfo, _ = _split_userinfo(raw)
    if userinfo:
        # The whole and its password: a user name alone is no secret, and may be a common word.
        _SECRETS.update(part for part in (userinfo, userinfo.partition(":")[2]) if len(part) >= 4)
        if scheme not in WEB:
            raise ValueError(f"{redact(raw)} carries credentials in the URL, where they would show in messages and "
                             "records; drop them from the URL and give them in --storage-options (key, secret, "
                             "token) or the environment (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...)")
    return raw
