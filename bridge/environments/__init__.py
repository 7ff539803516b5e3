"""Project environments: the image or devcontainer a task's worker and verifier run in."""
