"""What a job is, wherever it runs: its handle and status (the wire identity) and its
container + pod spec.  Uses data/ (mounts) and accelerators only; backends read it.
"""
