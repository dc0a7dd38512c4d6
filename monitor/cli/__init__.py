"""The ``embedding-monitor`` command line and the subcommands that are not a component's own."""
