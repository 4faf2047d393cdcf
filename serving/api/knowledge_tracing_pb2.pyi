from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Interaction(_message.Message):
    __slots__ = ("question_id", "skill_id", "correct", "skill_ids")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    SKILL_IDS_FIELD_NUMBER: _ClassVar[int]
    question_id: int
    skill_id: int
    correct: int
    skill_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, question_id: _Optional[int] = ..., skill_id: _Optional[int] = ..., correct: _Optional[int] = ..., skill_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class HistoryColumns(_message.Message):
    __slots__ = ("question_ids", "skill_ids", "correct", "skill_lengths", "skill_values")
    QUESTION_IDS_FIELD_NUMBER: _ClassVar[int]
    SKILL_IDS_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    SKILL_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    SKILL_VALUES_FIELD_NUMBER: _ClassVar[int]
    question_ids: _containers.RepeatedScalarFieldContainer[int]
    skill_ids: _containers.RepeatedScalarFieldContainer[int]
    correct: _containers.RepeatedScalarFieldContainer[int]
    skill_lengths: _containers.RepeatedScalarFieldContainer[int]
    skill_values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, question_ids: _Optional[_Iterable[int]] = ..., skill_ids: _Optional[_Iterable[int]] = ..., correct: _Optional[_Iterable[int]] = ..., skill_lengths: _Optional[_Iterable[int]] = ..., skill_values: _Optional[_Iterable[int]] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("question_id", "skill_id", "skill_ids")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_IDS_FIELD_NUMBER: _ClassVar[int]
    question_id: int
    skill_id: int
    skill_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, question_id: _Optional[int] = ..., skill_id: _Optional[int] = ..., skill_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("model", "version", "history", "candidates", "learner_id", "history_columns", "explain")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    history: _containers.RepeatedCompositeFieldContainer[Interaction]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    learner_id: str
    history_columns: HistoryColumns
    explain: ExplainOptions
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., history: _Optional[_Iterable[_Union[Interaction, _Mapping]]] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., learner_id: _Optional[str] = ..., history_columns: _Optional[_Union[HistoryColumns, _Mapping]] = ..., explain: _Optional[_Union[ExplainOptions, _Mapping]] = ...) -> None: ...

class ExplainOptions(_message.Message):
    __slots__ = ("top_k",)
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    top_k: int
    def __init__(self, top_k: _Optional[int] = ...) -> None: ...

class AttendedInteraction(_message.Message):
    __slots__ = ("position", "question_id", "skill_ids", "correct", "weight", "head_attention")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_IDS_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    HEAD_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    position: int
    question_id: int
    skill_ids: _containers.RepeatedScalarFieldContainer[int]
    correct: bool
    weight: float
    head_attention: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, position: _Optional[int] = ..., question_id: _Optional[int] = ..., skill_ids: _Optional[_Iterable[int]] = ..., correct: _Optional[bool] = ..., weight: _Optional[float] = ..., head_attention: _Optional[_Iterable[float]] = ...) -> None: ...

class CandidateExplanation(_message.Message):
    __slots__ = ("attended", "head_weights")
    ATTENDED_FIELD_NUMBER: _ClassVar[int]
    HEAD_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    attended: _containers.RepeatedCompositeFieldContainer[AttendedInteraction]
    head_weights: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, attended: _Optional[_Iterable[_Union[AttendedInteraction, _Mapping]]] = ..., head_weights: _Optional[_Iterable[float]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("probabilities", "model", "version", "history_used", "prediction_id", "explanations")
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_USED_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLANATIONS_FIELD_NUMBER: _ClassVar[int]
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    model: str
    version: int
    history_used: int
    prediction_id: str
    explanations: _containers.RepeatedCompositeFieldContainer[CandidateExplanation]
    def __init__(self, probabilities: _Optional[_Iterable[float]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., history_used: _Optional[int] = ..., prediction_id: _Optional[str] = ..., explanations: _Optional[_Iterable[_Union[CandidateExplanation, _Mapping]]] = ...) -> None: ...

class LearnerRequest(_message.Message):
    __slots__ = ("history", "candidates", "learner_id", "history_columns")
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    history: _containers.RepeatedCompositeFieldContainer[Interaction]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    learner_id: str
    history_columns: HistoryColumns
    def __init__(self, history: _Optional[_Iterable[_Union[Interaction, _Mapping]]] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., learner_id: _Optional[str] = ..., history_columns: _Optional[_Union[HistoryColumns, _Mapping]] = ...) -> None: ...

class LearnerResult(_message.Message):
    __slots__ = ("probabilities", "history_used", "version", "prediction_id")
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    HISTORY_USED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_ID_FIELD_NUMBER: _ClassVar[int]
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    history_used: int
    version: int
    prediction_id: str
    def __init__(self, probabilities: _Optional[_Iterable[float]] = ..., history_used: _Optional[int] = ..., version: _Optional[int] = ..., prediction_id: _Optional[str] = ...) -> None: ...

class PredictBatchRequest(_message.Message):
    __slots__ = ("model", "version", "learners")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    learners: _containers.RepeatedCompositeFieldContainer[LearnerRequest]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., learners: _Optional[_Iterable[_Union[LearnerRequest, _Mapping]]] = ...) -> None: ...

class PredictBatchResponse(_message.Message):
    __slots__ = ("results", "model", "version")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LearnerResult]
    model: str
    version: int
    def __init__(self, results: _Optional[_Iterable[_Union[LearnerResult, _Mapping]]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class RecommendRequest(_message.Message):
    __slots__ = ("model", "version", "history", "learner_id", "candidates", "target_probability", "top_k", "exclude_seen", "history_columns", "explain")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_SEEN_FIELD_NUMBER: _ClassVar[int]
    HISTORY_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    history: _containers.RepeatedCompositeFieldContainer[Interaction]
    learner_id: str
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    target_probability: float
    top_k: int
    exclude_seen: bool
    history_columns: HistoryColumns
    explain: ExplainOptions
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., history: _Optional[_Iterable[_Union[Interaction, _Mapping]]] = ..., learner_id: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., target_probability: _Optional[float] = ..., top_k: _Optional[int] = ..., exclude_seen: _Optional[bool] = ..., history_columns: _Optional[_Union[HistoryColumns, _Mapping]] = ..., explain: _Optional[_Union[ExplainOptions, _Mapping]] = ...) -> None: ...

class Recommendation(_message.Message):
    __slots__ = ("question_id", "probability", "explanation")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    question_id: int
    probability: float
    explanation: CandidateExplanation
    def __init__(self, question_id: _Optional[int] = ..., probability: _Optional[float] = ..., explanation: _Optional[_Union[CandidateExplanation, _Mapping]] = ...) -> None: ...

class RecommendResponse(_message.Message):
    __slots__ = ("recommendations", "model", "version", "history_used", "excluded", "prediction_id")
    RECOMMENDATIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_USED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_ID_FIELD_NUMBER: _ClassVar[int]
    recommendations: _containers.RepeatedCompositeFieldContainer[Recommendation]
    model: str
    version: int
    history_used: int
    excluded: int
    prediction_id: str
    def __init__(self, recommendations: _Optional[_Iterable[_Union[Recommendation, _Mapping]]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., history_used: _Optional[int] = ..., excluded: _Optional[int] = ..., prediction_id: _Optional[str] = ...) -> None: ...

class MasteryRequest(_message.Message):
    __slots__ = ("model", "version", "history", "learner_id", "history_columns", "skill_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    SKILL_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    history: _containers.RepeatedCompositeFieldContainer[Interaction]
    learner_id: str
    history_columns: HistoryColumns
    skill_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., history: _Optional[_Iterable[_Union[Interaction, _Mapping]]] = ..., learner_id: _Optional[str] = ..., history_columns: _Optional[_Union[HistoryColumns, _Mapping]] = ..., skill_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SkillMastery(_message.Message):
    __slots__ = ("skill_id", "probability")
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    skill_id: int
    probability: float
    def __init__(self, skill_id: _Optional[int] = ..., probability: _Optional[float] = ...) -> None: ...

class MasteryResponse(_message.Message):
    __slots__ = ("skills", "model", "version", "history_used")
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_USED_FIELD_NUMBER: _ClassVar[int]
    skills: _containers.RepeatedCompositeFieldContainer[SkillMastery]
    model: str
    version: int
    history_used: int
    def __init__(self, skills: _Optional[_Iterable[_Union[SkillMastery, _Mapping]]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., history_used: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("event_id", "question_id", "skill_id", "correct", "timestamp_ms", "skill_ids")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_ID_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    SKILL_IDS_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    question_id: int
    skill_id: int
    correct: int
    timestamp_ms: int
    skill_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, event_id: _Optional[str] = ..., question_id: _Optional[int] = ..., skill_id: _Optional[int] = ..., correct: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., skill_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("learner_id", "events")
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    learner_id: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, learner_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class ObserveResponse(_message.Message):
    __slots__ = ("stored", "duplicates", "history_length")
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    HISTORY_LENGTH_FIELD_NUMBER: _ClassVar[int]
    stored: int
    duplicates: int
    history_length: int
    def __init__(self, stored: _Optional[int] = ..., duplicates: _Optional[int] = ..., history_length: _Optional[int] = ...) -> None: ...

class ForgetLearnerRequest(_message.Message):
    __slots__ = ("learner_id",)
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    learner_id: str
    def __init__(self, learner_id: _Optional[str] = ...) -> None: ...

class ForgetLearnerResponse(_message.Message):
    __slots__ = ("existed", "deleted")
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    deleted: int
    def __init__(self, existed: _Optional[bool] = ..., deleted: _Optional[int] = ...) -> None: ...

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("prediction_id", "question_id", "correct")
    PREDICTION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    prediction_id: str
    question_id: int
    correct: int
    def __init__(self, prediction_id: _Optional[str] = ..., question_id: _Optional[int] = ..., correct: _Optional[int] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    def __init__(self, recorded: _Optional[int] = ...) -> None: ...
