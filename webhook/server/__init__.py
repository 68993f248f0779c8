"""HTTP/TLS plumbing around the admission decision: app, TLS, reloads, metrics, logs."""
