"""The generic path: any ``torch.utils.data.Dataset`` in fastload's own worker processes.

workers.py is the main side (dispatch, the iterator, errors, shutdown), worker_proc.py what runs in a worker
and the messages both sides speak, shm.py the shared-memory slots batches travel in.
"""
