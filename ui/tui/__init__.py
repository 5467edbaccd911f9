"""The Textual TUI (`specscope tui`): step through a trace, follow a growing one, or drive a live run."""
