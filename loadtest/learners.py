"""The parts of the locust load test that do not need locust: target check, vocabulary, learners, interceptor.

The loopback-only target check, the model's vocabulary, the simulated learners and the gRPC
interceptor that reports each call.

They live apart from loadtest/locustfile.py because importing locust monkey-patches the whole
process with gevent: `routerkt bench load` (which runs the gateway in-process) and the unit tests
import this module, never the locustfile.

A simulated learner keeps its own history (oldest first, capped at `max_history`, so messages stay
bounded), asks for P(correct) on 1..K candidate questions drawn from the model's real vocabulary (a
small share of unknown ids on purpose), then "answers" one of them: correct with the predicted
probability, and the answer joins its history.
"""
from __future__ import annotations

import ipaddress
import random
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import grpc

from routerkt.contract.repository_reader import latest_version, list_models, read_vocab
from routerkt.errors import UserError
from serving.api import knowledge_tracing_pb2 as pb

# The locustfile's user classes and the RPC each one calls (bench/load.py checks both were exercised).
USER_RPCS: dict[str, str] = {"LearnerUser": "Predict", "BatchUser": "PredictBatch", "SessionUser": "Observe"}
DEFAULT_WEIGHTS: dict[str, int] = {"LearnerUser": 3, "BatchUser": 1}   # the default users mix
REQUEST_TYPE = "grpc"                       # locust's "Type" column for every call


class NotLoopbackError(UserError):
    """The load-test target is not a loopback address (only those may be loaded here)."""


def parse_user_mix(text: str, flag: str = "--user-classes") -> dict[str, int]:
    """"LearnerUser:3,BatchUser" -> {"LearnerUser": 3, "BatchUser": 1}: the user classes to run and
    their locust weights (a class without a weight gets its default one)."""
    mix: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, weight = item.partition(":")
        name = name.strip()
        if name not in USER_RPCS:
            raise UserError(f"{flag}: unknown user class {name!r} (classes: {', '.join(USER_RPCS)})")
        if sep and (not weight.strip().isdigit() or int(weight) < 1):
            raise UserError(f"{flag}: weight of {name} must be an integer >= 1, got {weight!r}")
        if name in mix:
            raise UserError(f"{flag}: {name} is named twice")
        mix[name] = int(weight) if sep else DEFAULT_WEIGHTS.get(name, 1)
    if not mix:
        raise UserError(f"{flag}: name at least one user class ({', '.join(USER_RPCS)})")
    return mix


def format_user_mix(mix: dict[str, int]) -> str:
    return ",".join(f"{name}:{weight}" for name, weight in mix.items())


# -- target --------------------------------------------------------------------------------------
def loopback_target(host: str | None) -> str:
    """Check `host` ("127.0.0.1:50051", "localhost:50051", "[::1]:50051"; no scheme) and return it
    as a gRPC target. Anything but 127.0.0.0/8, localhost or ::1 raises NotLoopbackError."""
    if not host:
        raise UserError("no target: pass the gateway as --host 127.0.0.1:PORT")
    host = host.strip()
    if "://" in host:
        raise UserError(f"target {host!r}: give HOST:PORT without a scheme, e.g. 127.0.0.1:50051")
    if host.startswith("["):
        name, sep, port = host[1:].partition("]:")
        if not sep:
            raise UserError(f"target {host!r}: expected [IPV6]:PORT")
    else:
        name, sep, port = host.rpartition(":")
        if not sep or not name:
            raise UserError(f"target {host!r}: expected HOST:PORT, e.g. 127.0.0.1:50051")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(f"target {host!r}: port must be a number in [1, 65535]")
    if name.lower() != "localhost":
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            raise NotLoopbackError(f"target {host!r}: only loopback targets are allowed "
                                   "(127.0.0.0/8, localhost or ::1), not a host name") from None
        if not (address.version == 4 and address in ipaddress.ip_network("127.0.0.0/8")
                or address == ipaddress.ip_address("::1")):
            raise NotLoopbackError(f"target {host!r}: only loopback targets are allowed "
                                   "(127.0.0.0/8, localhost or ::1)")
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


# -- vocabulary ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Vocabulary:
    """The raw ids one model version knows (what a real platform would send)."""

    model: str
    version: int
    questions: tuple[int, ...]            # raw question ids, ascending
    question_skills: dict[int, tuple[int, ...]]   # raw question -> its raw skill set ((-1,) = none known)

    @property
    def first_unknown(self) -> int:
        """Question ids from here on are unknown to the model."""
        return self.questions[-1] + 1


def skill_fields(skills: tuple[int, ...]) -> dict:
    """A skill set as message fields: skill_id for a set of one (single-skill traffic as before),
    skill_ids for several."""
    return {"skill_id": skills[0]} if len(skills) == 1 else {"skill_ids": list(skills)}


def resolve_model(repository: Path | str, model: str | None) -> tuple[str, int]:
    """(model name, latest version) in `repository`; `model` None/"" = the repository's only model."""
    repository = Path(repository)
    if not repository.is_dir():
        raise UserError(f"model repository {repository} is not a folder "
                        "(run `make serve` or `routerkt export` first)")
    models = list_models(repository)
    if not models:
        raise UserError(f"no models in {repository} (run `make serve` or `routerkt export` first)")
    if not model:
        if len(models) > 1:
            raise UserError(f"{repository} holds several models ({', '.join(models)}): choose one with --model")
        model = models[0]
    elif model not in models:
        raise UserError(f"no model {model!r} in {repository} (models: {', '.join(models)})")
    version = latest_version(repository, model)
    if version is None:
        raise UserError(f"model {model!r} in {repository} has no version folder")
    return model, version


def load_vocabulary(repository: Path | str, model: str | None) -> Vocabulary:
    """The vocabulary of the latest version of `model` (see resolve_model)."""
    name, version = resolve_model(repository, model)
    vocab = read_vocab(Path(repository), name, version)
    if not vocab.questions:
        raise UserError(f"the vocabulary of model {name!r} version {version} has no questions")
    return Vocabulary(name, version, tuple(sorted(vocab.questions)), dict(vocab.question_skills))


# -- learners ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LearnerOptions:
    max_candidates: int = 4          # candidates per question round: 1..K
    max_history: int = 200           # interactions kept (the oldest are dropped)
    unknown_share: float = 0.02      # share of candidate questions the model never saw

    def __post_init__(self) -> None:
        if self.max_candidates < 1:
            raise UserError(f"max_candidates must be >= 1, got {self.max_candidates}")
        if self.max_history < 0:
            raise UserError(f"max_history must be >= 0, got {self.max_history}")
        if not 0.0 <= self.unknown_share <= 1.0:
            raise UserError(f"unknown_share must be in [0, 1], got {self.unknown_share}")


class Learner:
    """One simulated learner: a bounded history that grows with each answered question."""

    def __init__(self, vocabulary: Vocabulary, options: LearnerOptions, rng: random.Random) -> None:
        self.vocabulary = vocabulary
        self.options = options
        self.rng = rng
        self.history: deque[pb.Interaction] = deque(maxlen=options.max_history)
        self.answered = 0                # questions answered in total (history keeps the last ones)
        self.learner_id = f"bench-{rng.getrandbits(64):016x}"   # for session users (the store keeps the history)

    def pick_candidates(self) -> list[pb.Candidate]:
        """1..K distinct questions to ask about; skills are left to the gateway's lookup."""
        questions = self.vocabulary.questions
        k = self.rng.randint(1, min(self.options.max_candidates, len(questions)))
        picked = self.rng.sample(questions, k)
        for i in range(k):
            if self.rng.random() < self.options.unknown_share:
                picked[i] = self.vocabulary.first_unknown + self.rng.randrange(1_000_000)
        return [pb.Candidate(question_id=q) for q in picked]

    def answer(self, candidates: Sequence[pb.Candidate], probabilities: Sequence[float]) -> pb.Interaction:
        """Answer one of `candidates` (correct with its predicted probability); it joins the history."""
        if not candidates or len(candidates) != len(probabilities):
            raise ValueError(f"{len(probabilities)} probabilities for {len(candidates)} candidates")
        i = self.rng.randrange(len(candidates))
        question = candidates[i].question_id
        correct = int(self.rng.random() < float(probabilities[i]))
        skills = self.vocabulary.question_skills.get(question, (-1,))      # -1: "unknown skill"
        interaction = pb.Interaction(question_id=question, correct=correct, **skill_fields(skills))
        self.history.append(interaction)
        self.answered += 1
        return interaction

    def learner_request(self, candidates: Sequence[pb.Candidate]) -> pb.LearnerRequest:
        return pb.LearnerRequest(history=list(self.history), candidates=list(candidates))

    def predict_by_id_request(self, candidates: Sequence[pb.Candidate]) -> pb.PredictRequest:
        return pb.PredictRequest(model=self.vocabulary.model, learner_id=self.learner_id, candidates=list(candidates))

    def observe_request(self, interaction: pb.Interaction) -> pb.ObserveRequest:
        """The answer just given, as the one event of an Observe (event id: its sequence number)."""
        skills = (skill_fields(tuple(interaction.skill_ids)) if interaction.skill_ids
                  else {"skill_id": interaction.skill_id})
        return pb.ObserveRequest(learner_id=self.learner_id, events=[pb.Event(
            event_id=str(self.answered), question_id=interaction.question_id, correct=interaction.correct,
            **skills)])

    def predict_request(self, candidates: Sequence[pb.Candidate]) -> pb.PredictRequest:
        return pb.PredictRequest(model=self.vocabulary.model, history=list(self.history),
                                 candidates=list(candidates))


# -- reporting each call to locust ---------------------------------------------------------------
class RequestEvent(Protocol):
    """What the interceptor needs of locust's `environment.events.request` (an EventHook)."""

    def fire(self, **kwargs: Any) -> None: ...


class GrpcCallError(Exception):
    """A failed call as locust records it: `CODE: details` (never an empty message)."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"{code.name}: {details or '(no details)'}")
        self.code = code
        self.details = details or ""


class RequestEventInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Times each unary call and fires one locust request event: name = the RPC method
    ("Predict"), response_time in ms, response_length = the response's serialized size, and on
    failure a GrpcCallError. The caller still sees the call's normal result or RpcError."""

    def __init__(self, request_event: RequestEvent, clock: Callable[[], float] = time.perf_counter) -> None:
        self.request_event = request_event
        self.clock = clock

    def intercept_unary_unary(self, continuation, client_call_details, request):
        method = client_call_details.method
        name = (method.decode() if isinstance(method, bytes) else str(method)).rsplit("/", 1)[-1]
        start_time = time.time()
        started = self.clock()
        try:
            outcome = continuation(client_call_details, request)
        except Exception as exc:             # not an RPC outcome at all: report, then re-raise
            self._fire(name, start_time, started, None, _wrap(exc))
            raise
        try:
            response = outcome.result()
        except grpc.RpcError as exc:
            self._fire(name, start_time, started, None, _wrap(exc))
        except Exception as exc:
            self._fire(name, start_time, started, None, _wrap(exc))
        else:
            self._fire(name, start_time, started, response, None)
        return outcome

    def _fire(self, name: str, start_time: float, started: float, response: Any,
              exception: Exception | None) -> None:
        size = response.ByteSize() if response is not None and hasattr(response, "ByteSize") else 0
        self.request_event.fire(request_type=REQUEST_TYPE, name=name,
                                response_time=(self.clock() - started) * 1000.0, response_length=size,
                                response=response, context={}, exception=exception, start_time=start_time)


def _wrap(exc: BaseException) -> Exception:
    """A GrpcCallError carrying the status code name and details (locust shows repr(exception))."""
    code = getattr(exc, "code", None)
    if callable(code):
        details = getattr(exc, "details", None)
        try:
            return GrpcCallError(code(), details() if callable(details) else None)
        except Exception:                    # an RpcError without a status: fall through
            pass
    return GrpcCallError(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
