"""Evaluations: things that score a sampling client (a model) on held-out items.

Evaluators here satisfy ``tempering_protocols``' ``SamplingClientEvaluator`` (an async callable
from a sampling client to a dict of metrics), so the SFT and RL loops, the recipes and
``tempering eval`` run any of them. Each item draws its own sampling seed, derived from the
evaluator's seed and the item's index, so two items never share a random stream.

Import evaluators from their modules (``tempering.evals.<module>``).
"""
