"""The two arbiters of a queue's state (ackqueue.interfaces.IArbiter): local.py, for a
storage this process holds alone (memory decides, the store learns), and shared.py, for a
storage processes share through a server (the store decides)."""
