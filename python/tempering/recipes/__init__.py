"""Ready-made pipelines built from the library's pieces.

- :mod:`tempering.recipes.demo`: ``tempering demo`` (``make demo``): SFT on arithmetic, then RL
  with verifiable rewards from that checkpoint, on the local engine with the tiny model.
- :mod:`tempering.recipes.arithmetic`: the demo's data, RL task and accuracy evaluator.
- :mod:`tempering.recipes.report`: its plot (matplotlib: the ``recipes`` extra) and HTML report.

Example::

    from tempering.recipes.demo import DemoConfig
    summary = asyncio.run(DemoConfig(out="/tmp/demo", sft_steps=40, rl_steps=4)())
"""
