"""Transports by URI scheme: `file`, `http(s)` and `mooncake` (Mooncake transfer engine). A new
scheme registers its factory (`register_transport`) without touching the load pipeline."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from ckpt_agent.transport.base import ByteStream, Transport, is_untrusted
from ckpt_agent.transport.guard import SOURCE_POLICY, check_source

TransportFactory = Callable[[str], Transport]

_FACTORIES: dict[str, TransportFactory] = {}


def register_transport(scheme: str, factory: TransportFactory) -> None:
    _FACTORIES[scheme] = factory


def supported_schemes() -> list[str]:
    return sorted(_FACTORIES)


def check_uri(uri: str) -> None:
    """Raise ValueError if no transport handles `uri` or it cannot be parsed."""
    scheme = urlsplit(uri).scheme
    if scheme not in _FACTORIES:
        raise ValueError(
            f"no transport for {scheme or 'a scheme-less'} URI (supported: {supported_schemes()})"
        )
    _FACTORIES[scheme](uri).close()


def open_transport(uri: str) -> Transport:
    """A transport for the source ``uri``; raises LoadError(InvalidSource) if the agent's source
    policy (`guard.SOURCE_POLICY`) refuses it."""
    check_source(uri)
    return _FACTORIES[urlsplit(uri).scheme](uri)


def _http(uri: str) -> Transport:
    from ckpt_agent.transport.http import HttpTransport

    return HttpTransport(uri, policy=SOURCE_POLICY.get())


def _file(uri: str) -> Transport:
    from ckpt_agent.transport.file import FileTransport

    return FileTransport(uri)


def _mooncake(uri: str) -> Transport:
    from ckpt_agent.transport.mooncake.client import MooncakeTransport
    from ckpt_agent.transport.mooncake.runtime import MooncakeUnavailable

    try:
        return MooncakeTransport(uri, policy=SOURCE_POLICY.get())
    except MooncakeUnavailable as exc:
        # ValueError: requests naming a mooncake source are refused up front, with the reason.
        raise ValueError(str(exc)) from None


register_transport("http", _http)
register_transport("https", _http)
register_transport("file", _file)
register_transport("mooncake", _mooncake)

__all__ = [
    "ByteStream",
    "Transport",
    "check_uri",
    "is_untrusted",
    "open_transport",
    "register_transport",
    "supported_schemes",
]
