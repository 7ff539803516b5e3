"""worker-bridge benchmarks: the pipeline's cost against the floor of doing the same work by hand
(`git` and `docker run`), measured as ratios in one run. Entry point: `python -m bench`."""
