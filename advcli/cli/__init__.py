"""The command line: Typer options, saved options and terminal rendering; the only place rich and
typer are imported."""
