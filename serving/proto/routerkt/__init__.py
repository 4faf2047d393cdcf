"""Generated gRPC code for the routerkt.* proto packages."""
