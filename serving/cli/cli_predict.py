"""`routerkt predict`: call the gateway's Predict (or Recommend, or Mastery) from the command line.

    routerkt predict --target localhost:50051 --model NAME [--version N]
                     --history "q:s:c,q:s:c,..." | --learner-id ID  --candidates "q[:s],q[:s]"
                     [--recommend [--target-probability 0.7] [--top-k K] [--exclude-seen]]
                     [--explain K]   (Predict / Recommend: the K past interactions each candidate attended to)
                     [--mastery [--skills "s,s"]]   (no --candidates: P(correct) per skill)
                     [--timeout 2.0] [--json]

History items are question:skill:correct (skill may be left empty, "q::c", to use the question's
skill set from the vocabulary, or -1 for an unknown skill; several skills separated by `;` are the
interaction's skill set, "q:3;17:c", sent as skill_ids: quote the argument, `;` ends a shell
command); an empty --history is a cold start. Candidates are question ids, optionally with :skill
or :skill;skill. Prints one line per candidate (or one JSON
object with --json); with --recommend, the candidates in the Recommend policy's order (closest to
the target probability first); with --mastery, one line per skill (every skill of the version,
or those of --skills). With --explain K (docs/api.md, "Explanations"), under each candidate: the
head weights and the K attended interactions (position in the history, question, skills, correct,
weight); with --json, each candidate's explanation as the HTTP mirror writes it. Bad flags: one-line
error, exit 2. gRPC errors: one line with the status code and message, exit 1.
"""
from __future__ import annotations

import argparse
import json
import sys

from routerkt.errors import UserError
from serving.security.client_flags import add_client_flags, api_key, tls_ca


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="localhost:50051", help="gateway gRPC address HOST:PORT")
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument("--version", type=int, default=0, help="model version (0 = latest served)")
    parser.add_argument("--history", default="", help='past interactions, oldest first: "q:s:c,q:s;s:c" (may be empty)')
    parser.add_argument("--candidates", default="", help='candidate questions: "q[:s],q[:s;s]" (not with --mastery)')
    parser.add_argument("--learner-id", default="", help="take the history from the gateway's session store")
    parser.add_argument("--recommend", action="store_true", help="call Recommend instead of Predict")
    parser.add_argument("--target-probability", type=float, default=None,
                        help="Recommend: target P(correct), default 0.7")
    parser.add_argument("--top-k", type=int, default=None, help="Recommend: how many to return (default: all)")
    parser.add_argument("--exclude-seen", action="store_true", help="Recommend: drop questions already in the history")
    parser.add_argument("--explain", type=int, default=None, metavar="K",
                        help="Predict / Recommend: explain each candidate by the K past interactions it attended "
                             "to most (1 .. window - 1)")
    parser.add_argument("--mastery", action="store_true", help="call Mastery: P(correct) per skill")
    parser.add_argument("--skills", default="", help='Mastery: skill ids "s,s" (default: every skill of the version)')
    parser.add_argument("--timeout", type=float, default=2.0, help="deadline of the call in seconds")
    parser.add_argument("--json", action="store_true", help="print the response as one JSON object")
    add_client_flags(parser)


def parse_int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise UserError(f"{what}: {text.strip()!r} is not an integer") from None


Skills = int | list[int] | None        # skill_id, skill_ids (a set), or neither


def parse_skills(text: str, what: str) -> Skills:
    """'' -> None, '3' -> 3, '3;17' -> [3, 17]."""
    if not text.strip():
        return None
    if ";" not in text:
        return parse_int(text, what)
    return [parse_int(s, what) for s in text.split(";")]


def skill_fields(skills: Skills) -> dict:
    """The message fields of `skills`: {}, {"skill_id": s} or {"skill_ids": [...]}."""
    if skills is None:
        return {}
    return {"skill_ids": skills} if isinstance(skills, list) else {"skill_id": skills}


def parse_history(text: str) -> list[tuple[int, Skills, int]]:
    """'q:s:c,q::c,q:s;s:c' -> [(q, s, c), (q, None, c), (q, [s, s], c)]."""
    items = []
    for i, item in enumerate(p for p in text.split(",") if p.strip()):
        parts = item.split(":")
        if len(parts) != 3:
            raise UserError(f"--history item {i + 1} {item.strip()!r} must be question:skill:correct")
        question = parse_int(parts[0], f"--history item {i + 1} question")
        skill = parse_skills(parts[1], f"--history item {i + 1} skill")
        items.append((question, skill, parse_int(parts[2], f"--history item {i + 1} correct")))
    return items


def parse_candidates(text: str) -> list[tuple[int, Skills]]:
    """'q,q:s,q:s;s' -> [(q, None), (q, s), (q, [s, s])]."""
    items = []
    for i, item in enumerate(p for p in text.split(",") if p.strip()):
        parts = item.split(":")
        if len(parts) > 2:
            raise UserError(f"--candidates item {i + 1} {item.strip()!r} must be question[:skill]")
        skill = None if len(parts) == 1 else parse_skills(parts[1], f"--candidates item {i + 1} skill")
        items.append((parse_int(parts[0], f"--candidates item {i + 1} question"), skill))
    if not items:
        raise UserError("--candidates needs at least one question id")
    return items


def build_request(args: argparse.Namespace):
    from serving.api import knowledge_tracing_pb2 as pb

    if args.timeout <= 0:
        raise UserError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if ":" not in args.target:
        raise UserError(f"--target must be HOST:PORT, got {args.target!r}")
    if args.explain is not None and args.explain < 1:
        raise UserError(f"--explain must be >= 1 (interactions per candidate), got {args.explain}")
    explain = {} if args.explain is None else {"explain": pb.ExplainOptions(top_k=args.explain)}
    try:
        history = [pb.Interaction(question_id=question, correct=correct, **skill_fields(skills))
                   for question, skills, correct in parse_history(args.history)]
        if args.mastery:
            if args.candidates.strip() or args.recommend or explain:
                raise UserError("--mastery takes no --candidates, no --recommend and no --explain")
            skills = [parse_int(s, "--skills item") for s in args.skills.split(",") if s.strip()]
            return pb.MasteryRequest(model=args.model, version=args.version, history=history,
                                     learner_id=args.learner_id, skill_ids=skills)
        if args.skills.strip():
            raise UserError("--skills needs --mastery")
        candidates = [pb.Candidate(question_id=q, **skill_fields(s)) for q, s in parse_candidates(args.candidates)]
        if args.recommend:
            extra = {k: v for k, v in (("target_probability", args.target_probability), ("top_k", args.top_k))
                     if v is not None}
            return pb.RecommendRequest(model=args.model, version=args.version, history=history,
                                       learner_id=args.learner_id, candidates=candidates,
                                       exclude_seen=args.exclude_seen, **extra, **explain)
        return pb.PredictRequest(model=args.model, version=args.version, history=history, candidates=candidates,
                                 learner_id=args.learner_id, **explain)
    except ValueError as exc:                     # an id beyond int64
        raise UserError(f"bad id: {exc}") from None


def explanation_json(explanation) -> dict:
    """One CandidateExplanation as the HTTP mirror writes it."""
    return {"head_weights": list(explanation.head_weights), "attended": [
        {"position": a.position, "question_id": a.question_id, "skill_ids": list(a.skill_ids), "correct": a.correct,
         "weight": a.weight, "head_attention": list(a.head_attention)} for a in explanation.attended]}


def explanation_lines(explanation) -> list[str]:
    """One CandidateExplanation as indented text lines: the head weights, then one line per attended interaction."""
    lines = ["  head weights: " + " ".join(f"{w:.3f}" for w in explanation.head_weights)]
    for a in explanation.attended:
        skills = ";".join(str(s) for s in a.skill_ids) or "-"
        lines.append(f"  attended position {a.position}\tquestion {a.question_id}\tskills {skills}\t"
                     f"correct {int(a.correct)}\tweight {a.weight:.4f}")
    return lines


def run(args: argparse.Namespace) -> int:
    import grpc

    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc

    from serving.client import connect

    request = build_request(args)
    with connect(args.target, api_key=api_key(args), tls_ca=tls_ca(args)) as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        try:
            call = stub.Mastery if args.mastery else stub.Recommend if args.recommend else stub.Predict
            response = call(request, timeout=args.timeout)
        except grpc.RpcError as exc:
            details = (exc.details() or "").splitlines()[0] if exc.details() else ""
            print(f"routerkt predict: {exc.code().name}: {details}", file=sys.stderr)
            return 1
    print_response(args, request, response)
    return 0


def print_response(args: argparse.Namespace, request, response) -> None:
    """The answer to `request` on stdout: text lines, or one JSON object with --json."""
    if args.mastery:
        if args.json:
            print(json.dumps({"model": response.model, "version": response.version,
                              "history_used": response.history_used,
                              "skills": [{"skill_id": s.skill_id, "probability": s.probability}
                                         for s in response.skills]}))
        else:
            print(f"model {response.model} version {response.version} (history used: {response.history_used})")
            for s in response.skills:
                print(f"skill {s.skill_id}\tP(correct) = {s.probability:.6f}")
        return
    explained = request.HasField("explain")
    if args.recommend:
        recs = response.recommendations
        if args.json:
            print(json.dumps({"model": response.model, "version": response.version, "excluded": response.excluded,
                              "recommendations": [{"question_id": r.question_id, "probability": r.probability,
                                                   **({"explanation": explanation_json(r.explanation)} if explained
                                                      else {})} for r in recs]}))
        else:
            print(f"model {response.model} version {response.version} (history used: {response.history_used}, "
                  f"excluded as seen: {response.excluded})")
            for rank, r in enumerate(recs, 1):
                print(f"{rank}. question {r.question_id}\tP(correct) = {r.probability:.6f}")
                for line in explanation_lines(r.explanation) if r.HasField("explanation") else ():
                    print(line)
        return
    if args.json:
        print(json.dumps({"model": response.model, "version": response.version,
                          "history_used": response.history_used,
                          "candidates": [c.question_id for c in request.candidates],
                          "probabilities": list(response.probabilities),
                          **({"explanations": [explanation_json(e) for e in response.explanations]} if explained
                             else {})}))
    else:
        print(f"model {response.model} version {response.version} (history used: {response.history_used})")
        for j, (candidate, p) in enumerate(zip(request.candidates, response.probabilities)):
            print(f"question {candidate.question_id}\tP(correct) = {p:.6f}")
            for line in explanation_lines(response.explanations[j]) if j < len(response.explanations) else ():
                print(line)
