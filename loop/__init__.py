"""The learning loop: `routerkt retrain` (cli_retrain.py) and its stages (retrain/), on the layer above serving
and export: it trains and exports models and uses serving's public API (the session store's export, the
rollout policy through the gateway or its file) directly."""
