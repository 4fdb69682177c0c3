"""The embedded local backend: a job's command as a supervised local process, its
machine-wide slots, venvs, GPUs, environment, and why it failed or never started."""
