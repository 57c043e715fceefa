"""Sense: what is here. The hardware, the cluster around this process, the
machine's memory, and facts about the user's model and data.

Nothing here changes the process, the model or the data; `hardware` is the one
seam tests replace with a fake GPU box, TPU host or cluster.
"""
