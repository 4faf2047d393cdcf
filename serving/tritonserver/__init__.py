"""The tritonserver process that `routerkt serve` (and the tests, benchmarks) start beside the gateway:

- launcher.py    TritonServer: start (bounded wait until ready), stop, kill; its stubs and shared memory
- command.py     its command line: ports, loopback TCP or the private Unix socket, key-restricted APIs
- readiness.py   whether a starting server is ready (HTTP /v2/health/ready or gRPC ServerReady)
- install.py     the wheel's server, the python backend directory and the environment it needs
- restarts.py    TritonRestarter: restarts the server after it died
- watchdog.py    a guard process that stops the server if the process that started it dies first
- procfs.py      /proc helpers: children, command lines, start times, mapped files
"""
