"""Helpers several stages share. Stage modules (``tasks/<stage>.py``) never import each other:
what two stages need lives here, below them (``inputs``: the catalog, SID map, history rows and
the shared recommender; ``baselines``: EASE's and the blend's choice, which the baselines stage
writes and evaluate reads; ``training``: the TRL arguments, LoRA and device every trainer
uses)."""
