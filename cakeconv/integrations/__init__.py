"""Integrations of cakeconv with model libraries (each imports its library lazily).

- ``cakeconv.integrations.fla``: flash-linear-attention (``fla``, 0.6.0). ``swap_short_convolutions``
  puts cakeconv's deterministic op under every ``fla.modules.ShortConvolution`` of a model, and
  ``CakeShortConvolution`` is the drop-in module class. Importing this package, or that module,
  does not import ``fla``.
"""
