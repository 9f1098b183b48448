"""Processes: supervising one command to its end, the process tree, signals as events, the bounded wait."""
