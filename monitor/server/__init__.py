"""The HTTP port: the bounded server, ``/metrics`` families, health, admin routes and credentials."""
