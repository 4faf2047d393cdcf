"""What the transports serve: `Endpoints`, assembled once by create_server (serving/server.py) and
handed to the gRPC servicer and the HTTP app, which never see the server itself."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from serving.pipeline.parts import VersionPolicy
from serving.pipeline.prediction import PredictionService
from serving.queries.recommend import Recommender
from serving.security.guard import Guard
from serving.sessions.session_service import SessionService


class GatewayHealth(Protocol):
    """The gateway's own state, as the transports report it (/readyz)."""

    @property
    def ready(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...


@dataclass(frozen=True)
class Endpoints:
    """The services behind both transports, and the gateway's health."""

    service: PredictionService
    recommender: Recommender
    sessions: SessionService | None
    policy: VersionPolicy
    health: GatewayHealth
    guard: Guard = field(default_factory=Guard)     # API keys and scopes (none: all allowed)
