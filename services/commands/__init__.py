"""The ``capc`` command and its subcommands: every entry point a user runs."""
