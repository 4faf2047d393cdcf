"""The gateway's two transports over one set of services (endpoints.py: `Endpoints`):

- grpc_api.py         the gRPC servicer of routerkt.v1: protobuf messages -> calls, one error site
- http_api.py         the HTTP mirror's app (create_app): assembles the three below
- http_routes.py      its routes (health and metrics, the calls, rollout) and JSON bodies -> calls
- http_middleware.py  request counting, the API key gate, the body size and time guard
- http_errors.py      its one error site (`error_response`) and exception handlers
- http_models.py      the strict pydantic JSON bodies
"""
