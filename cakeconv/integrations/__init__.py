"""Integrations of cakeconv with model libraries (each imports its library lazily, or never).

Each runs the training op on cakeconv (every width W from 2 to 8, with SiLU or without an
activation, at its real width) and delegates what carries convolution state (initial or final
states, decode steps) or lies outside the op's operands to the library's own code; each module's
docstring gives its rule.

- ``cakeconv.integrations.fla``: flash-linear-attention (``fla``, 0.6.0). ``swap_short_convolutions``
  puts cakeconv's deterministic op under every ``fla.modules.ShortConvolution`` of a model, and
  ``CakeShortConvolution`` is the drop-in module class; ``unswap_short_convolutions`` undoes the swap. Importing this package, or that module,
  does not import ``fla``.
- ``cakeconv.integrations.fla.causal_conv1d``: FLA's functional ``causal_conv1d`` on cakeconv's op.
- ``cakeconv.integrations.dao``: Dao-AILab's causal-conv1d 1.7.0 API, ``causal_conv1d_fn`` and
  ``causal_conv1d_update``, with the same signatures and semantics, on cakeconv's op where it
  applies and delegated to causal-conv1d (or a PyTorch implementation) otherwise. It does not
  import ``causal_conv1d`` until a call is delegated.
- ``cakeconv.integrations.transformers``: ``swap_causal_conv1d(model)`` makes every layer of a
  Hugging Face transformers model that calls ``causal_conv1d_fn`` (Qwen3-Next, Qwen3.5, LFM2,
  LFM3, Inkling, Mamba2, ...) call cakeconv's, process-wide (it rebinds the modeling modules'
  global), and ``unswap_causal_conv1d`` undoes it. It never imports transformers.
- ``cakeconv.integrations.mamba_ssm``: ``swap()`` / ``unswap()`` rebind causal-conv1d's
  ``causal_conv1d_fwd_function`` / ``causal_conv1d_bwd_function`` (and ``causal_conv1d_fn``) where
  mamba_ssm's modules read them, so Mamba2's and Mamba1's fused training paths run cakeconv.
- ``cakeconv.integrations.report``: ``SwapReport``, what every swap returns (each convolution or
  binding it looked at, on cakeconv or why not); a swap warns (``CakeconvSwapWarning``) when
  convolutions stay off cakeconv.
"""
