"""Room runs: a room of browser tabs trains one model by DiLoCo, the server as the outer
optimizer (run_config.RoomConfig). codec.py: how pseudo-gradients travel; outer.py: the outer
step; rounds.py: the room's state and rounds on disk (each worker's batches: data/shards.py)."""
