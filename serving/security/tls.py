"""TLS for the gateway's two ports from PEM files, reloaded when the files change (no restart).

gRPC: grpc.dynamic_ssl_server_credentials, whose fetcher grpc calls for new handshakes; it returns
a new configuration only when the files' stamps changed and the new pair loads. HTTP: uvicorn gets
one ssl.SSLContext (`HandingContext`) that makes no TLS object itself: asyncio asks it to wrap each
new connection and it hands that to the context built from the files last loaded; `maintain()`
checks the files every RELOAD_CHECK_S and builds a NEW context when they changed. Both transports
thus start from an empty trust store at every reload: a client CA removed from the file is no longer
trusted (loading the file again into the same context would only add to its store). With a client
CA (`--tls-client-ca`) both ports require a client certificate signed by it (mTLS). A pair caught
half-written (a key that does not match its certificate) is skipped until it loads.

Session resumption skips the client certificate's check, so a session or ticket issued before a
reload must not be resumed after it. OpenSSL resumes from the session cache and ticket keys of the
SSL_CTX a connection STARTED with; the connection is therefore made by the current context itself
(its own cache and ticket keys, fresh at every reload), not switched to it from a long-lived one
during the handshake: switching (a server-name callback) let a TLS 1.2 session id and a TLS 1.3
ticket from before a CA switch pass, and so did turning tickets off (`num_tickets = 0`,
OP_NO_TICKET), since Python cannot turn off the server's session-id cache. Within one load,
resumption stays on. grpc makes a new SSL_CTX per configuration, which refuses the same resumption
(tests/integration/test_security_tls.py checks both ports with TLS 1.2 and 1.3). Connections open
at a reload keep going until they close.
"""
from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import grpc

from routerkt.errors import UserError

log = logging.getLogger("routerkt.security")
RELOAD_CHECK_S = 1.0


class HandingContext(ssl.SSLContext):
    """The context uvicorn holds: each connection is wrapped by `files`' current context (see above).
    It has no certificate, so anything that handshakes on it directly fails rather than pass."""

    files: "TlsFiles"

    def wrap_bio(self, incoming, outgoing, server_side=False, server_hostname=None, session=None):
        return self.files.current.wrap_bio(incoming, outgoing, server_side=server_side,
                                           server_hostname=server_hostname, session=session)

    def wrap_socket(self, sock, *args, **kwargs):
        return self.files.current.wrap_socket(sock, *args, **kwargs)


class TlsFiles:
    """The certificate, key and optional client CA of both ports (a Background part)."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.paths = tuple(Path(p) for p in (cert, key, client_ca) if p is not None)
        self.cert, self.key, self.client_ca = Path(cert), Path(key), client_ca and Path(client_ca)
        for flag, path in zip(("--tls-cert", "--tls-key", "--tls-client-ca"), self.paths):
            if not path.is_file():
                raise UserError(f"{flag} {path}: no such file")
        try:
            self.current = self._new_context()         # what HTTP connections are made by
        except (ssl.SSLError, OSError) as exc:
            raise UserError(f"--tls-cert/--tls-key: cannot load the pair ({exc.__class__.__name__})") from None
        self.context = HandingContext(ssl.PROTOCOL_TLS_SERVER)      # what uvicorn holds
        self.context.files = self
        self._http_stamp = self._grpc_stamp = self.stamp()

    def stamp(self) -> tuple:
        out = []
        for path in self.paths:
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.client_ca)
        return context

    # -- gRPC ----------------------------------------------------------------------------------
    def _grpc_config(self):
        return grpc.ssl_server_certificate_configuration(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.client_ca.read_bytes() if self.client_ca is not None else None)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._grpc_config(), self._fetch,
                                                   require_client_authentication=self.client_ca is not None)

    def _fetch(self):
        """grpc's certificate fetcher: a new configuration when the files changed, else None."""
        stamp = self.stamp()
        if stamp == self._grpc_stamp:
            return None
        try:
            self._new_context()                     # the pair must load before grpc gets it
            config = self._grpc_config()
        except (ssl.SSLError, OSError):
            return None
        self._grpc_stamp = stamp
        log.info("TLS certificate reloaded for gRPC")
        return config

    # -- HTTP ----------------------------------------------------------------------------------
    def reload_http(self) -> bool:
        """A new HTTP context from changed files (a fresh trust store); True when it did."""
        stamp = self.stamp()
        if stamp == self._http_stamp:
            return False
        try:
            self.current = self._new_context()
        except (ssl.SSLError, OSError):
            return False                            # half-written: next time
        self._http_stamp = stamp
        log.info("TLS certificate reloaded for HTTP")
        return True

    async def maintain(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_CHECK_S)
            await asyncio.to_thread(self.reload_http)

    async def close(self) -> None:
        pass
