"""Analyses of one study each: the Gao et al. scaling fits (:mod:`.gao`), the gold-RM validation (:mod:`.gold_validation`)."""
