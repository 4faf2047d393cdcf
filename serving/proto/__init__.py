"""Protocol buffers of the gateway API (package routerkt.v1); generated code is committed."""
