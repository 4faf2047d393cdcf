"""The gateway's command-line entry points: `routerkt serve` (cli_serve.py, with the start-up sample of
demo.py) and `routerkt predict` (cli_predict.py)."""
