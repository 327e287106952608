"""The data plane: engines, prompt rendering, answer parsing and the Ray actors that run shards.

Workers compute; they never touch the database and hold no credentials.
"""
