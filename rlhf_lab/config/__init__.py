"""Typed settings (the structured-config dataclasses Hydra checks at composition) and the value checks Hydra cannot do."""
