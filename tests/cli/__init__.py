"""The command line, the demo and its view."""
