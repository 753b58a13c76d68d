"""Constants shared by the kernels, their launchers and the KCP programs (each defined once here).

- ``TAPS``: the seed's convolution width W = 4 (``weight[:, W - 1]`` multiplies the current token),
  the default of every function that takes a width.
- ``HALO_ROWS``: H = TAPS - 1 = 3, the seed width's halo: the rows a token reads before it
  (forward) and whose gradient it reads after it (backward). For a width W it is W - 1.
- ``MIN_WIDTH`` / ``MAX_WIDTH``: the widths W the library computes, 2 <= W <= 8 (SPEC 1b).
- ``ACTIVATIONS``: the values of every public ``activation`` keyword: "silu" (the default) or None.
- ``INTERPRET``: Triton's CPU interpreter is on (``TRITON_INTERPRET=1``). Triton reads the variable
  when it is imported, so it must be set before the first import of triton; it is read once here.
"""

import os

TAPS = 4
HALO_ROWS = TAPS - 1
MIN_WIDTH = 2
MAX_WIDTH = 8
ACTIVATIONS = ("silu", None)
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
