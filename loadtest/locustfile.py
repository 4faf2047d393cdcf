"""Locust load test of the gateway's gRPC API with simulated learners (run it through
`routerkt bench load`, or by hand):

    python -m locust -f loadtest/locustfile.py --headless -u 8 -r 8 -t 30s --host 127.0.0.1:50051 \
        --repository model_repository [--model NAME] [--weights LearnerUser:3,BatchUser:1]

- LearnerUser: one learner with its own growing history; each task asks Predict about 1..K
  candidate questions (with a deadline), answers one of them and appends the answer.
- BatchUser: several learners at once through PredictBatch (one call, then each learner answers).
Ids come from the latest version's vocab.json of the model (a small share of unknown questions on
purpose). Every call is reported to locust by loadtest/learners.py's interceptor (type "grpc", name
= the RPC). Only loopback targets are accepted. Each option below also reads the environment
variable named beside it.
"""
# grpc's blocking calls must yield to the gevent hub, or every locust user waits on the same
# blocked hub and N users silently behave like one client. init_gevent() has to run before any
# grpc channel exists (locust has already monkey-patched the process when it imports this file).
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import logging  # noqa: E402  (after init_gevent on purpose)
import random  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import gevent  # noqa: E402
import grpc  # noqa: E402
from locust import User, events, task  # noqa: E402
from locust.stats import CSV_STATS_INTERVAL_SEC  # noqa: E402

from loadtest.learners import (DEFAULT_WEIGHTS, USER_RPCS, Learner, LearnerOptions,  # noqa: E402
                               RequestEventInterceptor, Vocabulary, format_user_mix, load_vocabulary,
                               loopback_target, parse_user_mix)
from routerkt.errors import UserError  # noqa: E402
from serving.api import knowledge_tracing_pb2 as pb  # noqa: E402
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc  # noqa: E402

log = logging.getLogger("routerkt.locust")


@dataclass(frozen=True)
class LoadConfig:
    """Everything the users need, built once from locust's parsed options."""

    target: str
    vocabulary: Vocabulary
    learner: LearnerOptions
    batch_learners: int
    predict_timeout_s: float
    batch_timeout_s: float
    think_time_s: float


_config: LoadConfig | None = None


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    group = parser.add_argument_group("routerkt", "simulated learners (loadtest/locustfile.py)")
    group.add_argument("--repository", default="model_repository", env_var="ROUTERKT_LOAD_REPOSITORY",
                       help="Triton model repository the ids are read from (latest version's vocab.json)")
    group.add_argument("--model", default="", env_var="ROUTERKT_LOAD_MODEL",
                       help="model name (default: the repository's only model)")
    group.add_argument("--weights", default=format_user_mix(DEFAULT_WEIGHTS), env_var="ROUTERKT_LOAD_WEIGHTS",
                       help="user class weights, CLASS:WEIGHT,... (select classes by naming them at the end)")
    group.add_argument("--max-candidates", type=int, default=4, env_var="ROUTERKT_LOAD_MAX_CANDIDATES",
                       help="candidates per question round: 1..K")
    group.add_argument("--max-history", type=int, default=200, env_var="ROUTERKT_LOAD_MAX_HISTORY",
                       help="interactions a learner keeps (oldest dropped)")
    group.add_argument("--unknown-share", type=float, default=0.02, env_var="ROUTERKT_LOAD_UNKNOWN_SHARE",
                       help="share of candidate questions unknown to the model")
    group.add_argument("--batch-learners", type=int, default=8, env_var="ROUTERKT_LOAD_BATCH_LEARNERS",
                       help="learners per PredictBatch call (BatchUser)")
    group.add_argument("--predict-timeout", type=float, default=2.0, env_var="ROUTERKT_LOAD_PREDICT_TIMEOUT",
                       help="deadline of each Predict call, seconds")
    group.add_argument("--batch-timeout", type=float, default=5.0, env_var="ROUTERKT_LOAD_BATCH_TIMEOUT",
                       help="deadline of each PredictBatch call, seconds")
    group.add_argument("--think-time", type=float, default=0.05, env_var="ROUTERKT_LOAD_THINK_TIME",
                       help="wait between two tasks of a user: uniform in [0, this] seconds")


def build_config(options, host: str | None) -> LoadConfig:
    """Validate the options (UserError naming the bad one) and read the vocabulary."""
    target = loopback_target(host)
    for name in ("predict_timeout", "batch_timeout"):
        if not getattr(options, name) > 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0 seconds")
    if options.think_time < 0:
        raise UserError("--think-time must be >= 0 seconds")
    if options.batch_learners < 1:
        raise UserError("--batch-learners must be >= 1")
    learner = LearnerOptions(options.max_candidates, options.max_history, options.unknown_share)
    return LoadConfig(target=target, vocabulary=load_vocabulary(options.repository, options.model or None),
                      learner=learner, batch_learners=options.batch_learners,
                      predict_timeout_s=options.predict_timeout, batch_timeout_s=options.batch_timeout,
                      think_time_s=options.think_time)


@events.init.add_listener
def _configure(environment, **_kwargs) -> None:
    global _config
    try:
        _config = build_config(environment.parsed_options, environment.host)
        for user_class, weight in parse_user_mix(environment.parsed_options.weights, flag="--weights").items():
            {"LearnerUser": LearnerUser, "BatchUser": BatchUser, "SessionUser": SessionUser}[user_class].weight = weight
    except UserError as exc:
        log.error("routerkt locustfile: %s", exc)
        sys.exit(2)                          # before any user starts; SystemExit passes locust's handlers
    v = _config.vocabulary
    log.info("target %s, model %s version %d (%d questions)", _config.target, v.model, v.version, len(v.questions))


@events.test_stop.add_listener
def _let_the_csv_catch_up(**_kwargs) -> None:
    """locust rewrites its --csv stats every CSV_STATS_INTERVAL_SEC and does not write them once
    more at exit, so the last second of requests would be missing: the users are stopped by now,
    so wait one interval and the CSV holds the final numbers."""
    gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.25)


def _current_config() -> LoadConfig:
    if _config is None:
        raise RuntimeError("the locustfile was not initialised (locust's init event did not run)")
    return _config


class _GatewayUser(User):
    """A client of the gateway: its own channel, with every call reported to locust."""

    abstract = True

    def on_start(self) -> None:
        self.config = _current_config()
        self.rng = random.Random()
        # config.target passed loopback_target(); no proxy: grpc honours http_proxy otherwise.
        self.channel = grpc.insecure_channel(self.config.target, options=[("grpc.enable_http_proxy", 0)])
        intercepted = grpc.intercept_channel(self.channel, RequestEventInterceptor(self.environment.events.request))
        self.stub = pb_grpc.KnowledgeTracingServiceStub(intercepted)

    def on_stop(self) -> None:
        self.channel.close()

    def wait_time(self) -> float:
        return self.rng.uniform(0.0, self.config.think_time_s)

    def new_learner(self) -> Learner:
        return Learner(self.config.vocabulary, self.config.learner, random.Random(self.rng.random()))


class LearnerUser(_GatewayUser):
    """One learner: Predict on 1..K candidates, answer one, repeat."""

    weight = DEFAULT_WEIGHTS["LearnerUser"]

    def on_start(self) -> None:
        super().on_start()
        self.learner = self.new_learner()

    @task
    def practice(self) -> None:
        candidates = self.learner.pick_candidates()
        try:
            response = self.stub.Predict(self.learner.predict_request(candidates),
                                         timeout=self.config.predict_timeout_s)
        except grpc.RpcError:
            return                           # already recorded as a failure by the interceptor
        self.learner.answer(candidates, response.probabilities)


class BatchUser(_GatewayUser):
    """Several learners served by one PredictBatch call per round."""

    weight = DEFAULT_WEIGHTS["BatchUser"]

    def on_start(self) -> None:
        super().on_start()
        self.learners = [self.new_learner() for _ in range(self.config.batch_learners)]

    @task
    def practice_together(self) -> None:
        rounds = [(learner, learner.pick_candidates()) for learner in self.learners]
        request = pb.PredictBatchRequest(model=self.config.vocabulary.model,
                                         learners=[learner.learner_request(c) for learner, c in rounds])
        try:
            response = self.stub.PredictBatch(request, timeout=self.config.batch_timeout_s)
        except grpc.RpcError:
            return
        if len(response.results) != len(rounds):
            raise RuntimeError(f"PredictBatch returned {len(response.results)} results for {len(rounds)} learners")
        for (learner, candidates), result in zip(rounds, response.results):
            learner.answer(candidates, result.probabilities)


class SessionUser(_GatewayUser):
    """One learner whose history the gateway's session store keeps: Predict by learner_id on
    1..K candidates, answer one, Observe that answer, repeat."""

    weight = 1

    def on_start(self) -> None:
        super().on_start()
        self.learner = self.new_learner()

    @task
    def practice_with_a_session(self) -> None:
        candidates = self.learner.pick_candidates()
        try:
            response = self.stub.Predict(self.learner.predict_by_id_request(candidates),
                                         timeout=self.config.predict_timeout_s)
            interaction = self.learner.answer(candidates, response.probabilities)
            self.stub.Observe(self.learner.observe_request(interaction), timeout=self.config.predict_timeout_s)
        except grpc.RpcError:
            return                           # already recorded as a failure by the interceptor


assert {LearnerUser.__name__, BatchUser.__name__, SessionUser.__name__} == set(USER_RPCS)
