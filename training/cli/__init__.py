"""The `routerkt` training commands: train, evaluate, audit, reproduce, validity."""
