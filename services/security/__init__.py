"""Who may do what: TLS files and principals, certificates for a local
cluster, signed tokens, ACLs and the authorizer that checks every call."""
