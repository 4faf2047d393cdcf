"""Safe defaults: a gateway bound beyond loopback needs TLS and API keys, unless `--insecure`; one
on loopback without keys (`--insecure`) is warned about at every start."""
from __future__ import annotations

import ipaddress
import logging

from routerkt.errors import UserError

log = logging.getLogger("routerkt.security")
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(settings) -> str | None:
    """What a non-loopback bind lacks, as one line naming the flag; None when nothing."""
    if is_loopback(settings.host):
        return None
    if settings.tls_cert is None:
        return (f"--host {settings.host} is reachable from other machines: give --tls-cert and --tls-key "
                f"(or --insecure to serve without TLS)")
    if settings.api_keys is None:
        return (f"--host {settings.host} is reachable from other machines: give --api-keys "
                f"(or --insecure to serve without authentication)")
    return None


def refuse_exposure(settings) -> None:
    """UserError for an unprotected non-loopback bind, unless settings.insecure."""
    problem = exposure_problem(settings)
    if problem is not None and not settings.insecure:
        raise UserError(problem)


def warn_exposure(settings) -> None:
    """The warning an --insecure gateway logs at every start."""
    if settings.insecure and settings.api_keys is None and is_loopback(settings.host):
        log.warning("INSECURE: serving on %s without API keys (--insecure): any local user of this host may "
                    "call every RPC (read learners, forget them, change the rollout)", settings.host)
    elif exposure_problem(settings) is not None:
        log.warning("INSECURE: serving on %s without %s (--insecure): anyone who reaches the ports may call "
                    "every RPC", settings.host, "TLS" if settings.tls_cert is None else "API keys")
