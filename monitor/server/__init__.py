"""The HTTP port: the bounded server, health, admin routes and the client that calls them, credentials."""
