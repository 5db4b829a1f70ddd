"""The worker process: everything that imports the user's code, torch and egglog runs here, so a
hang or an abort can only take the worker down. See protocol.py for the messages."""
