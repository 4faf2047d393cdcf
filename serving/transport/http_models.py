"""The JSON bodies of the gateway's HTTP mirror (serving/transport/http_api.py): strict pydantic
models (JSON integers only, text without lone surrogates), the error body and the documented error
responses."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StrictInt

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# JSON integers only: no bool, no "12", no 1.0 (400 naming the field)
Int64 = Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)]
Int32 = Annotated[StrictInt, Field(ge=INT32_MIN, le=INT32_MAX)]


def _encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]


SKILL_IDS = "the skill set instead of skill_id (not both); each id as skill_id"


class InteractionIn(BaseModel):
    question_id: Int64
    skill_id: Int64 | None = Field(None, description="absent: the question's skill from the vocabulary; -1: unknown")
    correct: Int32 = Field(description="0 or 1")
    skill_ids: list[Int64] = Field(default_factory=list, description=SKILL_IDS)


class HistoryColumnsIn(BaseModel):
    """The history as columns (gRPC HistoryColumns): entry i of each list is interaction i."""
    question_ids: list[Int64]
    skill_ids: list[Int64] = Field(default_factory=list, description="empty: looked up from each question")
    correct: list[Int32] = Field(description="0 or 1, one per question id")
    skill_lengths: list[Int32] = Field(default_factory=list, description="skill sets, ragged (instead of skill_ids): "
                                       "the size of each interaction's set in skill_values, 0 = looked up")
    skill_values: list[Int64] = Field(default_factory=list, description="the sets' skill ids, one after the other")


class CandidateIn(BaseModel):
    question_id: Int64
    skill_id: Int64 | None = Field(None, description="absent: the question's skill from the vocabulary; -1: unknown")
    skill_ids: list[Int64] = Field(default_factory=list, description=SKILL_IDS)


class ExplainIn(BaseModel):
    top_k: Int32 = Field(0, description="past interactions per candidate, 1..window-1; 0: 5")


class LearnerQueryIn(BaseModel):
    """The fields every call about one learner shares: the model version and the learner's history."""
    model: Text
    version: Int64 = Field(0, description="0 = the latest served version")
    history: list[InteractionIn] = Field(default_factory=list, description="oldest first; may be empty")
    learner_id: Text = Field("", description="set: the history comes from the session store (history empty)")
    history_columns: HistoryColumnsIn | None = Field(None, description="the history as columns instead of history")


class PredictIn(LearnerQueryIn):
    candidates: list[CandidateIn]
    explain: ExplainIn | None = Field(None, description="set: explain each prediction (docs/api.md, Explanations)")


class AttendedOut(BaseModel):
    position: int
    question_id: int
    skill_ids: list[int]
    correct: bool
    weight: float
    head_attention: list[float]


class ExplanationOut(BaseModel):
    attended: list[AttendedOut]
    head_weights: list[float]


class PredictOut(BaseModel):
    probabilities: list[float]
    model: str
    version: int
    history_used: int
    prediction_id: str = ""
    explanations: list[ExplanationOut] = Field(default_factory=list)


class LearnerIn(BaseModel):
    history: list[InteractionIn] = Field(default_factory=list)
    candidates: list[CandidateIn]
    learner_id: Text = ""
    history_columns: HistoryColumnsIn | None = Field(None, description="the history as columns instead of history")


class LearnerOut(BaseModel):
    probabilities: list[float]
    history_used: int
    version: int
    prediction_id: str = ""


class PredictBatchIn(BaseModel):
    model: Text
    version: Int64 = 0
    learners: list[LearnerIn]


class PredictBatchOut(BaseModel):
    results: list[LearnerOut]
    model: str
    version: int


class RecommendIn(LearnerQueryIn):
    candidates: list[CandidateIn]
    target_probability: float | None = Field(None, description="in (0, 1); default 0.7")
    top_k: Int32 | None = Field(None, description=">= 1; default: every candidate")
    exclude_seen: bool = False
    explain: ExplainIn | None = Field(None, description="set: explain each recommendation")


class RecommendationOut(BaseModel):
    question_id: int
    probability: float
    explanation: ExplanationOut | None = None


class RecommendOut(BaseModel):
    recommendations: list[RecommendationOut]
    model: str
    version: int
    history_used: int
    excluded: int
    prediction_id: str = ""


class MasteryIn(LearnerQueryIn):
    skill_ids: list[Int64] = Field(default_factory=list, description="empty: every skill of the version")


class SkillMasteryOut(BaseModel):
    skill_id: int
    probability: float


class MasteryOut(BaseModel):
    skills: list[SkillMasteryOut]
    model: str
    version: int
    history_used: int


class ReportOutcomeIn(BaseModel):
    prediction_id: Text
    question_id: Int64
    correct: Int32 = Field(description="0 or 1")


class ReportOutcomeOut(BaseModel):
    recorded: int


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorOut(BaseModel):
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": text} for status, text in (
        (400, "INVALID_ARGUMENT: the field is named"), (404, "NOT_FOUND: unknown model or version"),
        (413, "body over the size limit"), (429, "RESOURCE_EXHAUSTED: the gateway is at its in-flight limit"),
        (503, "UNAVAILABLE: Triton or the model is not ready"), (504, "DEADLINE_EXCEEDED"))}
