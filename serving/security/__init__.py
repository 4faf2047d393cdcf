"""Who may call what: API keys and scopes, the audit log, TLS with certificate reload (docs/security.md)."""
