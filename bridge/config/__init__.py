"""Configuration: the settings every entry point loads (settings.py: `Config`, `load_config`),
their sections (sections.py), the names they come by without the models (names.py: the
`WORKER_BRIDGE_*` variables, the state root) and the task types' profiles (profiles.py).
Nothing is imported here: names.py is read at the CLI's start, before pydantic loads."""
