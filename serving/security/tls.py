"""TLS for the gateway's two ports from PEM files, reloaded when the files change (no restart).

gRPC: grpc.dynamic_ssl_server_credentials, whose fetcher grpc calls for new handshakes; it returns
a new configuration only when the files' stamps changed and the new pair loads. HTTP: uvicorn gets
one ssl.SSLContext whose server-name callback (called for every handshake, with or without SNI)
hands the connection to the context built from the files last loaded; `maintain()` checks the
files every RELOAD_CHECK_S and builds a NEW context when they changed. Both transports thus start
from an empty trust store at every reload: a client CA removed from the file is no longer trusted
(loading the file again into the same context would only add to its store). With a client CA
(`--tls-client-ca`) both ports require a client certificate signed by it (mTLS). A pair caught
half-written (a key that does not match its certificate) is skipped until it loads.
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


class TlsFiles:
    """The certificate, key and optional client CA of both ports (a Background part)."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.paths = tuple(Path(p) for p in (cert, key, client_ca) if p is not None)
        self.cert, self.key, self.client_ca = Path(cert), Path(key), client_ca and Path(client_ca)
        for flag, path in zip(("--tls-cert", "--tls-key", "--tls-client-ca"), self.paths):
            if not path.is_file():
                raise UserError(f"{flag} {path}: no such file")
        try:
            self._current = self._new_context()        # what HTTP connections are handed to
            self.context = self._new_context()         # what uvicorn holds: hands each handshake over
        except (ssl.SSLError, OSError) as exc:
            raise UserError(f"--tls-cert/--tls-key: cannot load the pair ({exc.__class__.__name__})") from None
        self.context.sni_callback = self._hand_over
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
    def _hand_over(self, connection, server_name, context) -> None:
        """The server-name callback: the handshake goes on with the context of the files last loaded
        (its certificate, its trust store for client certificates)."""
        connection.context = self._current

    def reload_http(self) -> bool:
        """A new HTTP context from changed files (a fresh trust store); True when it did."""
        stamp = self.stamp()
        if stamp == self._http_stamp:
            return False
        try:
            self._current = self._new_context()
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
