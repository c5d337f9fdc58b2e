"""Serving HTTP: the routes, every connection's bounds from accept to close, the TLS
handshake, the access log and the web config (TLS, basic auth, headers). It knows the
collection side only through :class:`exporter.http.routes.Source`."""
