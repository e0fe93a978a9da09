"""The command line: each subcommand a thin edge over gpuconsole.wiring."""
