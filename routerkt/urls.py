"""A gateway's HTTP base URL from what a user typed: a URL, or HOST:PORT alone."""
from __future__ import annotations


def gateway_url(gateway: str, tls: bool) -> str:
    """HOST:PORT alone means http:// (https:// when the caller trusts a CA); trailing slashes dropped."""
    base = gateway.rstrip("/")
    return base if "://" in base else ("https://" if tls else "http://") + base
