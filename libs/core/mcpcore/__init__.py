"""mcpcore: the shared, hand-written core of mcpmesh (errors, keys, store, lifecycle, config, wire, metrics).

Imports nothing of ours but the generated contracts (mcpapi); see pyproject's import-linter contracts.
"""
